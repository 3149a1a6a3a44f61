// The copy-rate ceilings with CUDA (see device_copy.h).
#include <cuda_runtime.h>

#include <algorithm>

#include "bench/e2e/device_copy.h"

namespace dequantd::e2e {

namespace {

// Bytes per second of cudaMemcpyAsync(dst, src, n, kind): best of 5 after a warm-up, CUDA events.
double BestCopyRate(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  float best_ms = 0;
  for (int i = 0; i < 6; ++i) {
    cudaEventRecord(start);
    cudaMemcpyAsync(dst, src, n, kind);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i > 0) best_ms = best_ms == 0 ? ms : std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best_ms > 0 ? static_cast<double>(n) / (best_ms * 1e-3) : 0;
}

bool HaveGpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) return true;
  cudaGetLastError();
  return false;
}

}  // namespace

double PinnedDeviceToHostBytesPerSecond(int64_t bytes, std::string* device) {
  device->clear();
  if (!HaveGpu()) return 0;
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
  const double rate = BestCopyRate(h, d, n, cudaMemcpyDeviceToHost);
  cudaFreeHost(h);
  cudaFree(d);
  return rate;
}

double DeviceCopyBytesPerSecond(int64_t bytes) {
  if (!HaveGpu()) return 0;
  void* src = nullptr;
  void* dst = nullptr;
  const size_t n = static_cast<size_t>(bytes);
  if (cudaMalloc(&src, n) != cudaSuccess) return 0;
  if (cudaMalloc(&dst, n) != cudaSuccess) {
    cudaFree(src);
    return 0;
  }
  cudaMemset(src, 1, n);
  const double rate = BestCopyRate(dst, src, n, cudaMemcpyDeviceToDevice);
  cudaFree(src);
  cudaFree(dst);
  return rate;
}

}  // namespace dequantd::e2e
