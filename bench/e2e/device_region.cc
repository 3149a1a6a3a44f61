// DeviceRegionBuffer (see device_region.h).
#include "bench/e2e/device_region.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#if DEQUANTD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dequantd::e2e {

#if DEQUANTD_HAVE_CUDA
namespace {

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  const std::string message = absl::StrCat(what, ": ", cudaGetErrorString(error));
  return error == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(message)
                                            : absl::InternalError(message);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceRegionBuffer>> DeviceRegionBuffer::Create(int64_t bytes) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError("device regions need a CUDA device; none is visible");
  }
  void* data = nullptr;
  if (absl::Status s = CudaStatus(cudaMalloc(&data, static_cast<size_t>(bytes)), "cudaMalloc");
      !s.ok()) {
    return s;
  }
  cudaIpcMemHandle_t handle;
  if (absl::Status s = CudaStatus(cudaIpcGetMemHandle(&handle, data), "cudaIpcGetMemHandle");
      !s.ok()) {
    cudaFree(data);
    return s;
  }
  return std::unique_ptr<DeviceRegionBuffer>(new DeviceRegionBuffer(
      data, bytes, std::string(reinterpret_cast<const char*>(&handle), sizeof(handle))));
}

DeviceRegionBuffer::~DeviceRegionBuffer() { cudaFree(data_); }

absl::Status DeviceRegionBuffer::Fill(uint8_t value) {
  if (absl::Status s =
          CudaStatus(cudaMemset(data_, value, static_cast<size_t>(bytes_)), "cudaMemset");
      !s.ok()) {
    return s;
  }
  return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

absl::Status DeviceRegionBuffer::CopyToHost(int64_t offset, absl::Span<uint8_t> out) const {
  return CudaStatus(cudaMemcpy(out.data(), static_cast<const uint8_t*>(data_) + offset, out.size(),
                               cudaMemcpyDeviceToHost),
                    "cudaMemcpy device to host");
}

#else

absl::StatusOr<std::unique_ptr<DeviceRegionBuffer>> DeviceRegionBuffer::Create(int64_t) {
  return absl::FailedPreconditionError("device regions need a build with CUDA (this one has none)");
}

DeviceRegionBuffer::~DeviceRegionBuffer() = default;

absl::Status DeviceRegionBuffer::Fill(uint8_t) {
  return absl::FailedPreconditionError("built without CUDA");
}

absl::Status DeviceRegionBuffer::CopyToHost(int64_t, absl::Span<uint8_t>) const {
  return absl::FailedPreconditionError("built without CUDA");
}

#endif

}  // namespace dequantd::e2e
