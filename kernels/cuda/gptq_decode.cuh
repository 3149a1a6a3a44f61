// Device-side decode of the GPTQ format (layer 1 of its kernels: no kernels here). The layout and
// the rounding rule come from kernels/gptq_format.h (whose StreamField / ZeroAt are host and
// device code); the scale load and the rounded store are the format-neutral scalar helpers of
// awq_decode.cuh. Every helper reproduces w = round_out(float(q - z) * float(s)) bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/awq_decode.cuh"  // LoadScaleAsFloat, StoreElement (format-neutral)
#include "kernels/gptq_format.h"

namespace dequantd::cuda {

// Device pointers and shape of one GPTQ launch (elements, not bytes).
struct GptqParams {
  const int32_t* qweight = nullptr;  // (K*b/32, N)
  const int32_t* qzeros = nullptr;   // (K/G, N*b/32)
  const void* scales = nullptr;      // (K/G, N) fp16 or bf16
  const int32_t* g_idx = nullptr;    // (K), or null: g = k / G
  void* out = nullptr;               // (K, N), or (N, K) when nk
  int64_t K = 0;
  int64_t N = 0;
  int64_t group_size = 0;
  int64_t groups = 0;      // K / G
  int64_t zero_words = 0;  // N * b / 32
  int bits = 4;
  uint32_t flags = 0;  // QuantShape::format_flags (gptq::kZerosV1, ...)
  bool nk = false;     // the result is (N, K)
};

// The group of input row k. g_idx values outside [0, groups) were refused where the tensors
// entered (gptq::CheckStored); the clamp only keeps a kernel that is handed one anyway inside
// scales and qzeros.
__device__ __forceinline__ int64_t GptqGroup(const GptqParams& p, int64_t k) {
  if (p.g_idx == nullptr) return k / p.group_size;
  const int64_t g = __ldg(p.g_idx + k);
  return g < 0 ? 0 : (g >= p.groups ? p.groups - 1 : g);
}

// float(q[k, n] - z[g, n]) * s[g, n] for group g (exact in fp32).
template <DType kScale>
__device__ __forceinline__ float GptqElement(const GptqParams& p, int64_t k, int64_t n, int64_t g) {
  const auto q = static_cast<int>(gptq::StreamField(p.qweight + n, p.N, k, p.bits));
  const auto z = static_cast<int>(gptq::ZeroAt(p.qzeros + g * p.zero_words, n, p.bits, p.flags));
  return __int2float_rn(q - z) * LoadScaleAsFloat<kScale>(p.scales, g * p.N + n);
}

// The zero word of 4-bit columns [8c, 8c + 8) in group g, with the v1 bias added to every field
// (gptq::ZeroAt's rule for whole words): field i is the zero of column 8c + i.
__device__ __forceinline__ uint32_t GptqZeroWord4(const GptqParams& p, int64_t g, int64_t c) {
  const auto word = static_cast<uint32_t>(__ldg(p.qzeros + g * p.zero_words + c));
  return (p.flags & gptq::kZerosV1) != 0 ? word + gptq::V1WordBias(4) : word;
}

}  // namespace dequantd::cuda
