// L2Flush (measure/l2_flush.h): a grid-stride read of the buffer with 16-byte loads.
#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "measure/l2_flush.h"

namespace dequantd::bench {
namespace {

// Reads `words` uint4 words. The XOR of a zeroed buffer is 0, never `never`, so `sink` is not
// written; the compare keeps the loads alive.
__global__ void ReadAllKernel(const uint4* __restrict__ data, int64_t words, uint32_t never,
                              uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    const uint4 v = data[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == never) *sink = acc;
}

constexpr int kThreads = 512;

}  // namespace

absl::StatusOr<L2Flush> L2Flush::Create(cudaStream_t stream) {
  int device = 0, l2 = 0, sms = 0;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  DEQUANTD_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t bytes = AlignUp(static_cast<int64_t>(std::max(l2, 1 << 20)) * kFlushL2Multiple);
  absl::StatusOr<DeviceBuffer> buffer = Allocate(bytes + 256);
  if (!buffer.ok()) return buffer.status();
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buffer->get(), 0, bytes + 256, stream));
  return L2Flush(*std::move(buffer), bytes, std::max(sms, 1) * 4);
}

absl::Status L2Flush::Enqueue(cudaStream_t stream) const {
  auto* base = static_cast<unsigned char*>(buffer_.get());
  ReadAllKernel<<<blocks_, kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(base), bytes_ / 16,
                                                  1u, reinterpret_cast<uint32_t*>(base + bytes_));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace dequantd::bench
