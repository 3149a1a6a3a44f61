// Device-side decode of the FP8 block-scaled format (layer 1 of its kernels: no kernels here). The
// layout and the rounding rule come from kernels/fp8_block_format.h (whose Fp32Product and the
// E4M3 conversion of kernels/dtype.h are host and device code); the rounded store is the
// format-neutral StoreElement of awq_decode.cuh. Every helper reproduces
//   w[n, k] = round_out( round_fp32( float32(weight[n, k]) * float32(s[n / 128, k / 128]) ) )
// bit for bit: one fp32 multiply (no fused operation to contract with), then one cvt.rn.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/awq_decode.cuh"  // StoreElement (format-neutral)
#include "kernels/fp8_block_format.h"

namespace dequantd::cuda {

// Device pointers and shape of one fp8_block launch (elements, not bytes).
struct Fp8BlockParams {
  const uint8_t* weight = nullptr;  // (N, K) E4M3
  const void* scale_inv = nullptr;  // (ceil(N/128), ceil(K/128)) fp32, bf16 or fp16
  void* out = nullptr;              // (N, K), or (K, N) when !nk
  int64_t K = 0;
  int64_t N = 0;
  int64_t grid_cols = 0;  // ceil(K / 128)
  bool nk = true;         // the result is (N, K)
};

// The scale of the block holding weight element (n, k), as a float (exact).
template <DType kScale>
__device__ __forceinline__ float Fp8BlockScale(const Fp8BlockParams& p, int64_t n, int64_t k) {
  const int64_t i = (n / fp8_block::kBlock) * p.grid_cols + k / fp8_block::kBlock;
  if constexpr (kScale == DType::kF32) {
    return __ldg(static_cast<const float*>(p.scale_inv) + i);
  } else {
    const uint16_t bits = __ldg(static_cast<const unsigned short*>(p.scale_inv) + i);
    if constexpr (kScale == DType::kF16) {
      return __half2float(__ushort_as_half(bits));
    } else {
      static_assert(kScale == DType::kBF16);
      return __uint_as_float(static_cast<uint32_t>(bits) << 16);
    }
  }
}

// Two E4M3 bytes (the low byte first) as floats: the hardware conversion to f16x2 (exact: every
// E4M3 value is an fp16), then to f32 (exact). Equal to Fp8E4m3BitsToFloat of each byte for every
// value but NaN, whose payload may differ (NaN passes through as NaN either way); one conversion
// instruction per pair where the bit-level decode costs about ten per byte.
__device__ __forceinline__ float2 E4m3x2ToFloat2(uint16_t two) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3);
  return __half22float2(__half2(raw));
}

// The fp32 products (fp8_block::Fp32Product: one multiply each) of kValues (8 or 4) consecutive
// E4M3 bytes at `src` (kValues-byte aligned) with scale s, from one 8- or 4-byte load.
template <int kValues>
__device__ __forceinline__ void E4m3Products(const uint8_t* src, float s, float (&v)[kValues]) {
  static_assert(kValues == 8 || kValues == 4);
  uint32_t words[kValues / 4];
  if constexpr (kValues == 8) {
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(src));
    words[0] = w.x;
    words[1] = w.y;
  } else {
    words[0] = __ldg(reinterpret_cast<const unsigned*>(src));
  }
#pragma unroll
  for (int i = 0; i < kValues / 2; ++i) {
    const float2 w = E4m3x2ToFloat2(static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2))));
    v[2 * i] = w.x * s;
    v[2 * i + 1] = w.y * s;
  }
}

}  // namespace dequantd::cuda
