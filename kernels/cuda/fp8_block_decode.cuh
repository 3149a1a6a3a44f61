// Device-side decode of the FP8 block-scaled format (layer 1 of its kernels: no kernels here). The
// layout and the rounding rule come from kernels/fp8_block_format.h (whose Fp32Product and the
// E4M3 conversion of kernels/dtype.h are host and device code); the rounded store is the
// format-neutral StoreElement of awq_decode.cuh. Every helper reproduces
//   w[n, k] = round_out( round_fp32( float32(weight[n, k]) * float32(s[n / 128, k / 128]) ) )
// bit for bit: one fp32 multiply (no fused operation to contract with), then one cvt.rn.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
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

// 16 consecutive outputs (one 16-byte vector of E4M3 bytes times one scale), rounded to kOut and
// stored at `out` (16-byte aligned): 2 vectors for fp16/bf16, 4 for fp32.
template <DType kOut>
__device__ __forceinline__ void StoreVec16(void* out, uint4 bytes, float s) {
  const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
  if constexpr (kOut == DType::kF32) {
    float4* dst = static_cast<float4*>(out);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float v[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        v[b] = fp8_block::Fp32Product(static_cast<uint8_t>(words[w] >> (8 * b)), s);
      }
      dst[w] = make_float4(v[0], v[1], v[2], v[3]);
    }
  } else {
    uint32_t packed[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t word = words[j / 2];
      const int shift = 16 * (j % 2);
      const float lo = fp8_block::Fp32Product(static_cast<uint8_t>(word >> shift), s);
      const float hi = fp8_block::Fp32Product(static_cast<uint8_t>(word >> (shift + 8)), s);
      if constexpr (kOut == DType::kF16) {
        packed[j] = static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
                    static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16;
      } else {
        static_assert(kOut == DType::kBF16);
        packed[j] = static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
                    static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16;
      }
    }
    uint4* dst = static_cast<uint4*>(out);
    dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  }
}

}  // namespace dequantd::cuda
