// Device-side decode of MXFP4 (layer 1 of its kernels: no kernels here). The layout, the element
// and its rounding come from kernels/mxfp4_format.h (NibbleOf, Element: the same __host__
// __device__ functions the CPU reference calls); this file adds the launch parameters and the
// rounded store. Every helper reproduces
//   w_e[k, n] = round_out( float32(FP4[nibble]) * float32(2^(scale - 127)) )
// bit for bit: Element's one fp32 multiply, then cvt.rn to the output dtype; a NaN (scale 0xFF
// with a +-0 value) is stored with the host conversion's bits (kernels/dtype.h), not cvt's
// canonical NaN, so CPU and CUDA results are identical byte for byte.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/mxfp4_format.h"

namespace dequantd::cuda {

// Device pointers and shape of one mxfp4 launch (elements, not bytes).
struct Mxfp4Params {
  const uint8_t* blocks = nullptr;  // (E*N, K/2) bytes
  const uint8_t* scales = nullptr;  // (E*N, K/32) E8M0
  void* out = nullptr;              // (E, N, K) when nk, else (E, K, N)
  int64_t K = 0;
  int64_t N = 0;
  int64_t experts = 1;
  int64_t groups = 0;  // K / 32: blocks per row
  bool nk = false;     // the result is (E, N, K)
};

// round_out(v) as the output's bits: 16 bits (fp16, bf16) or 32 (fp32). The only NaN
// mxfp4::Element yields is kNanBits, stored with the host conversion's bits (kernels/dtype.h).
template <DType kOut>
__device__ __forceinline__ uint32_t RoundOutBits(float v) {
  if constexpr (kOut == DType::kF32) {
    return __float_as_uint(v);
  } else if constexpr (kOut == DType::kF16) {
    const uint32_t nan = FloatToHalfBitsRne(BitsToFloat(mxfp4::kNanBits));
    return v != v ? nan : __half_as_ushort(__float2half_rn(v));
  } else {
    static_assert(kOut == DType::kBF16);
    const uint32_t nan = FloatToBf16BitsRne(BitsToFloat(mxfp4::kNanBits));
    return v != v ? nan : __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

// Stores round_out(v) at element i of `out`.
template <DType kOut>
__device__ __forceinline__ void StoreMxfp4(void* out, int64_t i, float v) {
  if constexpr (kOut == DType::kF32) {
    static_cast<float*>(out)[i] = v;
  } else {
    static_cast<uint16_t*>(out)[i] = static_cast<uint16_t>(RoundOutBits<kOut>(v));
  }
}

// Value j (0..31) of a 16-byte block `bytes` (as four little-endian words) with scale s.
__device__ __forceinline__ float BlockValue(const uint32_t (&words)[4], int j, uint8_t s) {
  const auto byte = static_cast<uint8_t>(words[j / 8] >> (8 * ((j / 2) % 4)));
  return mxfp4::Element(mxfp4::NibbleOf(byte, j), s);
}

}  // namespace dequantd::cuda
