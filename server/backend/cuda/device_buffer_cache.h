// Device buffers for results and inline inputs, borrowed per call and kept for reuse up to a
// byte limit, so steady traffic does not pay cudaMalloc/cudaFree per request.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace dequantd {

class BackendObserver;

namespace cuda {

class DeviceBufferCache;

// A device allocation borrowed from a DeviceBufferCache; returned to it on destruction. Buffers
// live only during a call: none is held when the cache is destroyed.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : cache_(std::exchange(other.cache_, nullptr)),
        ptr_(std::exchange(other.ptr_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(cache_, other.cache_);
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~DeviceBuffer();

  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }
  int64_t bytes() const { return bytes_; }

 private:
  friend class DeviceBufferCache;
  DeviceBuffer(DeviceBufferCache* cache, void* ptr, int64_t bytes)
      : cache_(cache), ptr_(ptr), bytes_(bytes) {}
  DeviceBufferCache* cache_ = nullptr;
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

// Per device. Keeps released buffers idle up to `limit_bytes` in total and reports the bytes it
// holds (live and idle) to `observer` (may be null) as kBuffers of `label` -- only from Acquire
// and Release, i.e. during calls: the destructor reports nothing (BackendObserver's contract; the
// observer may already be gone when the backend is destroyed). Thread-safe.
class DeviceBufferCache {
 public:
  DeviceBufferCache(int device, int64_t limit_bytes, BackendObserver* observer, std::string label)
      : device_(device), limit_bytes_(limit_bytes), observer_(observer), label_(std::move(label)) {}
  ~DeviceBufferCache();
  DeviceBufferCache(const DeviceBufferCache&) = delete;
  DeviceBufferCache& operator=(const DeviceBufferCache&) = delete;

  // The smallest idle buffer of at least `bytes` (and at most twice that), else a new one, on
  // the current device (which must be `device`). On out-of-memory, frees the idle buffers and
  // tries once more (RESOURCE_EXHAUSTED after that).
  absl::StatusOr<DeviceBuffer> Acquire(int64_t bytes);

 private:
  friend class DeviceBuffer;
  void Release(void* ptr, int64_t bytes);
  void FreeIdle();
  void AddAllocated(int64_t delta);

  const int device_;
  const int64_t limit_bytes_;
  BackendObserver* const observer_;
  const std::string label_;
  std::mutex mu_;
  std::multimap<int64_t, void*> idle_;  // bytes -> buffer; guarded by mu_
  int64_t idle_bytes_ = 0;              // guarded by mu_
  int64_t allocated_bytes_ = 0;         // live + idle buffers; guarded by mu_
};

}  // namespace cuda
}  // namespace dequantd
