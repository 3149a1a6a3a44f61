// Packed arithmetic on pairs of 16-bit floats held in one 32-bit word (low half = lower column),
// the second half of the nibble-pair decode (the first, placing codes in pairs, is
// kernels/nibble_pairs.h). Layer 1: device helpers only, format-neutral.
//
// Exactness, as the GPTQ and compressed-tensors kernels use them:
//   * SubPairs of two pairs of the same nibble_pairs form is exact (an integer |q - z| <= 15);
//   * MulPairs of such a difference d and a scale pair s of the same dtype is the correctly
//     rounded product (mul.rn.f16x2 / mul.rn.bf16x2, subnormals kept). The fp32 product of d
//     (4 significant bits) and s (11 bits for fp16, 8 for bf16) is exact, so MulPairs equals
//     round_dtype(float(d) * float(s)): GPTQ's round_out when the scale dtype is the output
//     dtype, compressed-tensors' round_sdt always;
//   * WidenPair is exact (every fp16 / bf16 value is a float), so a pair rounded once by
//     PackPair<kOut> after WidenPair is rounded once from the exact value.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/awq_decode.cuh"        // AsHalf2, AsBfloat162, AsU32
#include "kernels/cuda/row_chunk_kernel.cuh"  // PackPair, kChunk
#include "kernels/dtype.h"

namespace dequantd::cuda {

// a - b, each half rounded once (sub.rn), for kD fp16 or bf16 pairs.
template <DType kD>
__device__ __forceinline__ uint32_t SubPairs(uint32_t a, uint32_t b) {
  static_assert(kD == DType::kF16 || kD == DType::kBF16);
  if constexpr (kD == DType::kF16) {
    return AsU32(__hsub2_rn(AsHalf2(a), AsHalf2(b)));
  } else {
    return AsU32(__hsub2_rn(AsBfloat162(a), AsBfloat162(b)));
  }
}

// a * b, each half rounded once (mul.rn: never contracted into an FMA).
template <DType kD>
__device__ __forceinline__ uint32_t MulPairs(uint32_t a, uint32_t b) {
  static_assert(kD == DType::kF16 || kD == DType::kBF16);
  if constexpr (kD == DType::kF16) {
    return AsU32(__hmul2_rn(AsHalf2(a), AsHalf2(b)));
  } else {
    return AsU32(__hmul2_rn(AsBfloat162(a), AsBfloat162(b)));
  }
}

// The pair as two floats (exact).
template <DType kD>
__device__ __forceinline__ float2 WidenPair(uint32_t u) {
  static_assert(kD == DType::kF16 || kD == DType::kBF16);
  if constexpr (kD == DType::kF16) {
    return __half22float2(AsHalf2(u));
  } else {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
  }
}

// The same pair of kFrom values in kOut (fp16 or bf16), each rounded once (cvt.rn) from the exact
// value: the identity when kFrom == kOut.
template <DType kFrom, DType kOut>
__device__ __forceinline__ uint32_t ConvertPair(uint32_t u) {
  if constexpr (kFrom == kOut) {
    return u;
  } else {
    const float2 f = WidenPair<kFrom>(u);
    return PackPair<kOut>(f.x, f.y);
  }
}

// kChunk<kOut> / 2 pairs of kFrom values as one 16-byte chunk of kOut: each value rounded once to
// kOut (ConvertPair), or widened exactly for fp32 (2 pairs, 4 floats).
template <DType kFrom, DType kOut>
__device__ __forceinline__ uint4 PairsToChunk(const uint32_t (&pairs)[kChunk<kOut> / 2]) {
  if constexpr (kOut == DType::kF32) {
    const float2 a = WidenPair<kFrom>(pairs[0]);
    const float2 b = WidenPair<kFrom>(pairs[1]);
    return make_uint4(__float_as_uint(a.x), __float_as_uint(a.y), __float_as_uint(b.x),
                      __float_as_uint(b.y));
  } else {
    return make_uint4(ConvertPair<kFrom, kOut>(pairs[0]), ConvertPair<kFrom, kOut>(pairs[1]),
                      ConvertPair<kFrom, kOut>(pairs[2]), ConvertPair<kFrom, kOut>(pairs[3]));
  }
}

}  // namespace dequantd::cuda
