// PinnedDeviceToHostBytesPerSecond with CUDA (see device_copy.h).
#include <cuda_runtime.h>

#include <algorithm>

#include "bench/e2e/device_copy.h"

namespace dequantd::e2e {

double PinnedDeviceToHostBytesPerSecond(int64_t bytes, std::string* device) {
  device->clear();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) *device = prop.name;
  void* d = nullptr;
  void* h = nullptr;
  const size_t n = static_cast<size_t>(bytes);
  if (cudaMalloc(&d, n) != cudaSuccess) return 0;
  if (cudaMallocHost(&h, n) != cudaSuccess) {
    cudaFree(d);
    return 0;
  }
  cudaMemset(d, 1, n);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  float best_ms = 0;
  for (int i = 0; i < 6; ++i) {
    cudaEventRecord(start);
    cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i > 0) best_ms = best_ms == 0 ? ms : std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFreeHost(h);
  cudaFree(d);
  return best_ms > 0 ? static_cast<double>(bytes) / (best_ms * 1e-3) : 0;
}

}  // namespace dequantd::e2e
