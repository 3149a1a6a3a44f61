// DeviceBufferCache (see device_buffer_cache.h).
#include "server/backend/cuda/device_buffer_cache.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "kernels/cuda/cuda_status.h"
#include "server/backend/backend_observer.h"

namespace dequantd::cuda {
namespace {
// Buffers are rounded up to this many bytes (cudaMalloc itself aligns to 256).
constexpr int64_t kBufferAlign = 256;
}  // namespace

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cache_->Release(ptr_, bytes_);
}

DeviceBufferCache::~DeviceBufferCache() {
  cudaSetDevice(device_);
  for (auto& [bytes, ptr] : idle_) cudaFree(ptr);
}

absl::StatusOr<DeviceBuffer> DeviceBufferCache::Acquire(int64_t bytes) {
  bytes = (std::max<int64_t>(bytes, 1) + kBufferAlign - 1) / kBufferAlign * kBufferAlign;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = idle_.lower_bound(bytes);
    if (it != idle_.end() && it->first <= 2 * bytes) {
      DeviceBuffer buffer(this, it->second, it->first);
      idle_bytes_ -= it->first;
      idle_.erase(it);
      return buffer;
    }
  }
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, static_cast<size_t>(bytes)) != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) allocation error
    FreeIdle();
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, static_cast<size_t>(bytes)));
  }
  AddAllocated(bytes);
  return DeviceBuffer(this, ptr, bytes);
}

void DeviceBufferCache::Release(void* ptr, int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_bytes_ + bytes <= limit_bytes_) {
      idle_.emplace(bytes, ptr);
      idle_bytes_ += bytes;
      return;
    }
  }
  cudaFree(ptr);
  AddAllocated(-bytes);
}

void DeviceBufferCache::FreeIdle() {
  std::multimap<int64_t, void*> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle.swap(idle_);
    idle_bytes_ = 0;
  }
  for (auto& [bytes, ptr] : idle) {
    cudaFree(ptr);
    AddAllocated(-bytes);
  }
}

// Reported under the lock so that the last report is the current total.
void DeviceBufferCache::AddAllocated(int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  allocated_bytes_ += delta;
  if (observer_ != nullptr) {
    observer_->SetDeviceMemoryUsed(label_, DeviceMemoryKind::kBuffers, allocated_bytes_);
  }
}

}  // namespace dequantd::cuda
