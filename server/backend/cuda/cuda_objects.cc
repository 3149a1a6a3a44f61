// RAII owners of CUDA objects (see cuda_objects.h).
#include "server/backend/cuda/cuda_objects.h"

#include "kernels/cuda/cuda_status.h"

namespace dequantd::cuda {

absl::StatusOr<UniqueStream> MakeStream() {
  cudaStream_t stream = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return UniqueStream(stream);
}

absl::StatusOr<UniqueEvent> MakeEvent(bool timing) {
  cudaEvent_t event = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
  return UniqueEvent(event);
}

absl::StatusOr<UniqueDeviceMemory> MakeDeviceMemory(int64_t bytes) {
  void* ptr = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, static_cast<size_t>(bytes)));
  return UniqueDeviceMemory(ptr);
}

absl::StatusOr<UniquePinnedMemory> MakePinnedMemory(int64_t bytes) {
  void* ptr = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&ptr, static_cast<size_t>(bytes), cudaHostAllocDefault));
  return UniquePinnedMemory(static_cast<uint8_t*>(ptr));
}

double ElapsedSeconds(cudaEvent_t start, cudaEvent_t end) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, start, end) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<double>(ms) * 1e-3;
}

}  // namespace dequantd::cuda
