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

// Byte j (0..3) of `word` alone, the other bytes zero (one PRMT).
__device__ __forceinline__ uint32_t ByteOf(uint32_t word, int j) {
  return __byte_perm(word, 0u, 0x4440u | static_cast<uint32_t>(j));
}

// Byte b's two nibbles (b in bits 0-7, the rest zero) as the bits of an fp16 pair, low nibble in
// the low half: each nibble's magnitude bits (e1 e0 m) at fp16 bits 11-9 and its sign at bit 15
// make the fp16 (e1 e0 m) * 2^-14 for every nibble, normal (e > 0) or subnormal (e = 0: m *
// 2^-15), so that value times 2^14 (exact) is the E2M1 value (+-0 kept). Two multiplies spread
// the byte (b * (2^9 + 2^21) puts bits 2-0 at 11-9 and 6-4 at 27-25; b * (2^12 + 2^24) bit 3 at
// 15 and bit 7 at 31; the two shifted copies in each product do not overlap, so nothing carries)
// and one LOP3 keeps those bits: three instructions where six shifts and masks were.
__device__ __forceinline__ uint32_t NibbleHalves(uint32_t b) {
  return ((b * 0x00200200u) & 0x0E000E00u) | ((b * 0x01001000u) & 0x80008000u);
}

// The largest scale s whose 2^14 * 2^(s - 127) is a normal float: ByteValues14's range.
constexpr uint32_t kMaxScale14 = 240;

// 2^14 * 2^(s - 127) for s <= kMaxScale14 (exact: a power of two with a normal exponent).
__device__ __forceinline__ float Scale14(uint32_t s) { return __uint_as_float((s + 14u) << 23); }

// The two values of block byte `b` (b in bits 0-7, low nibble first) for a scale s <=
// kMaxScale14 given as Scale14(s): equal to mxfp4::Element(NibbleOf(b, j), s) for both, bit for
// bit. The fp16 of NibbleHalves is the E2M1 value times 2^-14, exactly, so its product with 2^14
// * 2^(s - 127) is Element's exact product fp4 * 2^(s - 127), rounded once to fp32 as Element
// rounds it (s = 0 included: 2^-113 is normal where Element's 2^-127 is not; the products are the
// same real number). One multiply per value.
__device__ __forceinline__ float2 ByteValues14(uint32_t b, float scale14) {
  const uint32_t h2 = NibbleHalves(b);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
  return make_float2(f.x * scale14, f.y * scale14);
}

// The same for any finite scale s != 0xFF given as `scale` (mxfp4::ScaleToFloat(s)): the exact
// E2M1 value (the fp16 times 2^14), then one fp32 multiply by the scale, as Element does. Scale
// 0xFF (inf * 0 = NaN) is Element's case.
__device__ __forceinline__ float2 ByteValues(uint32_t b, float scale) {
  const uint32_t h2 = NibbleHalves(b);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
  return make_float2(f.x * 16384.0f * scale, f.y * 16384.0f * scale);
}

}  // namespace dequantd::cuda
