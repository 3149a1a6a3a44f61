// Device-side decode of the compressed-tensors pack-quantized format (layer 1 of its kernels: no
// kernels here). The layout and the rounding rule come from kernels/compressed_tensors_format.h
// (whose StreamField / ZeroAt / ScaleIndex are host and device code); the scale load and the
// rounded store are the format-neutral scalar helpers of awq_decode.cuh. Every helper reproduces
// w = round_out(round_sdt(float(f - z) * float(s))) bit for bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/compressed_tensors_format.h"
#include "kernels/cuda/awq_decode.cuh"  // LoadScaleAsFloat, StoreElement (format-neutral)
#include "kernels/cuda/fast_divmod.h"

namespace dequantd::cuda {

// Device pointers and shape of one compressed-tensors launch (elements, not bytes).
struct CompressedTensorsParams {
  const int32_t* weight_packed = nullptr;      // (N, K*b/32)
  const void* weight_scale = nullptr;          // (N, K/G), or (1) with kTensorScale
  const int32_t* weight_zero_point = nullptr;  // (ceil(N*b/32), K/G), or null: symmetric
  const int32_t* weight_g_idx = nullptr;       // (K), or null: g = k / G
  void* out = nullptr;                         // (K, N), or (N, K) when nk
  int64_t K = 0;
  int64_t N = 0;
  int64_t group_size = 0;
  int64_t groups = 0;     // K / G
  int64_t row_words = 0;  // K * b / 32
  FastDivmod group_div;   // division by group_size (inputs k < 2^31)
  int bits = 4;
  uint32_t flags = 0;  // QuantShape::format_flags (compressed_tensors::kSym, ...)
  bool nk = false;     // the result is (N, K)
};

// The group of input column k. weight_g_idx values outside [0, groups) were refused where the
// tensors entered (compressed_tensors::CheckStored); the clamp only keeps a kernel that is handed
// one anyway inside weight_scale and weight_zero_point.
__device__ __forceinline__ int64_t CtGroup(const CompressedTensorsParams& p, int64_t k) {
  if (p.weight_g_idx == nullptr) return k / p.group_size;
  const int64_t g = __ldg(p.weight_g_idx + k);
  return g < 0 ? 0 : (g >= p.groups ? p.groups - 1 : g);
}

// v rounded once (RNE) to the scale dtype and back: round_sdt of the definition.
template <DType kScale>
__device__ __forceinline__ float RoundToScale(float v) {
  if constexpr (kScale == DType::kF16) {
    return __half2float(__float2half_rn(v));
  } else if constexpr (kScale == DType::kBF16) {
    return __bfloat162float(__float2bfloat16_rn(v));
  } else {
    return v;
  }
}

// z[n, g] as a float and s[n, g].
template <DType kScale>
__device__ __forceinline__ void CtZeroScale(const CompressedTensorsParams& p, int64_t n, int64_t g,
                                            float* z, float* s) {
  *z = static_cast<float>(compressed_tensors::ZeroAt(p.weight_zero_point, n, g, p.groups, p.bits));
  *s = LoadScaleAsFloat<kScale>(p.weight_scale,
                                compressed_tensors::ScaleIndex(n, g, p.groups, p.flags));
}

// The code f[n, k].
__device__ __forceinline__ float CtCode(const CompressedTensorsParams& p, int64_t n, int64_t k) {
  return static_cast<float>(StreamField(p.weight_packed + n * p.row_words, 1, k, p.bits));
}

}  // namespace dequantd::cuda
