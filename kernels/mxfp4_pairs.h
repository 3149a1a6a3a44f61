// MXFP4 values (kernels/mxfp4_format.h) two at a time as pairs of 16-bit floats, for the (E, K, N)
// kernel that writes a result row k from 8 neighbouring block rows n (kernels/cuda/mxfp4_cuda.cu,
// Mxfp4KnColumnKernel). Host and device code, integer operations only (kernels/nibble_pairs.h's
// lop3 / prmt, exact host emulations), pinned by tests/kernels/mxfp4_pairs_test.cc.
//
// E2M1 value -> 16-bit float: every E2M1 magnitude {0, 0.5, 1, 1.5, 2, 3, 4, 6} is exact in fp16
// and in bf16, so the unscaled value is a table look-up: prmt with four 3-bit magnitude indices as
// its selector reads one byte of each from an 8-entry byte table held in two registers (the high
// bytes; bf16 also needs the low bytes, fp16's are all zero), and the sign goes to bit 15.
// Scaling: w = round_out(FP4 * 2^(s - 127)) (the format's definition, exact in fp32 before
// round_out) equals one correctly rounded 16-bit multiply (mul.rn) of the table value by
// 2^(s - 127) written in the output dtype, whenever that power of two is a value of the dtype:
//   bf16: s in [0, 254] (2^-127 is a bf16 subnormal); every product is then exact in bf16, or
//         beyond 2^128 where fp32 and bf16 both give +-inf;
//   fp16: s in [103, 142] (2^-24 .. 2^15); the multiply rounds the exact product as the cvt.rn of
//         the fp32 product does (subnormals and overflow to +-inf included).
// Other scales (0xFF: inf * 0 = NaN, whose bits the format fixes; fp16 beyond the range) take the
// kernel's exact per-value path.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"  // DEQUANTD_HD, DType
#include "kernels/nibble_pairs.h"

namespace dequantd::mxfp4_pairs {

// High and low bytes of the 16-bit float of each E2M1 magnitude index m (byte m of the 8-byte
// table {kHi1, kHi0}: bytes 0-3 in the first word).
inline constexpr uint32_t kBf16Hi0 = 0x3F3F3F00u;  // m = 0..3: 0, 0.5, 1, 1.5 (0x3F00 ..)
inline constexpr uint32_t kBf16Hi1 = 0x40404040u;  // m = 4..7: 2, 3, 4, 6 (0x4000 ..)
inline constexpr uint32_t kBf16Lo0 = 0xC0800000u;
inline constexpr uint32_t kBf16Lo1 = 0xC0804000u;
inline constexpr uint32_t kF16Hi0 = 0x3E3C3800u;  // 0, 0.5 (0x3800), 1 (0x3C00), 1.5 (0x3E00)
inline constexpr uint32_t kF16Hi1 = 0x46444240u;  // 2 (0x4000), 3 (0x4200), 4 (0x4400), 6 (0x4600)

// The values of byte b of x (one block row) and byte b of y (the next row) as two pairs of kOut
// (fp16 or bf16): `even` = (x's low nibble, y's low nibble) = input k = 2b (+ 8w for word w),
// `odd` = the high nibbles = input k + 1. Unscaled. Ten (fp16: nine) instructions for 4 values.
template <DType kOut>
DEQUANTD_HD void E2m1CrossPairs(uint32_t x, uint32_t y, int b, uint32_t& even, uint32_t& odd) {
  namespace np = nibble_pairs;
  static_assert(kOut == DType::kF16 || kOut == DType::kBF16);
  // Nibbles 0-3 of `codes`: x even, x odd, y even, y odd; signs cleared so that no selector
  // nibble asks for prmt's sign replication.
  const uint32_t codes =
      np::Prmt(x, y, static_cast<uint32_t>(b) | static_cast<uint32_t>(4 + b) << 4);
  const uint32_t index = codes & 0x7777u;
  // x in byte 0 and y in byte 2: the signs of the even values at bits 3 / 19, odd at 7 / 23.
  const uint32_t split = np::CrossBytes(x, y, b);
  const uint32_t hi = np::Prmt(kOut == DType::kBF16 ? kBf16Hi0 : kF16Hi0,
                               kOut == DType::kBF16 ? kBf16Hi1 : kF16Hi1, index);
  uint32_t e;
  uint32_t o;
  if constexpr (kOut == DType::kBF16) {
    const uint32_t lo = np::Prmt(kBf16Lo0, kBf16Lo1, index);
    e = np::Prmt(lo, hi, 0x6240u);  // (lo.0 hi.0 | lo.2 hi.2): x even, y even
    o = np::Prmt(lo, hi, 0x7351u);  // (lo.1 hi.1 | lo.3 hi.3): x odd, y odd
  } else {
    e = np::Prmt(hi, 0u, 0x2404u);  // (0 hi.0 | 0 hi.2)
    o = np::Prmt(hi, 0u, 0x3414u);  // (0 hi.1 | 0 hi.3)
  }
  even = np::Lop3<np::kAndOr>(split << 12, 0x80008000u, e);
  odd = np::Lop3<np::kAndOr>(split << 8, 0x80008000u, o);
}

// Whether 2^(s - 127) is a value of kOut (the multiply path above applies).
template <DType kOut>
DEQUANTD_HD bool ScaleIsExactIn(uint32_t s) {
  if constexpr (kOut == DType::kBF16) {
    return s <= 254u;
  } else {
    return s >= 103u && s <= 142u;
  }
}

// 2^(s - 127) as kOut bits, for ScaleIsExactIn<kOut>(s).
template <DType kOut>
DEQUANTD_HD uint32_t ScaleBits(uint32_t s) {
  if constexpr (kOut == DType::kBF16) {
    return s == 0 ? 0x0040u : s << 7;  // 2^-127 = 64 * 2^-133 (subnormal), else exponent s
  } else {
    return s >= 113u ? (s - 112u) << 10 : 1u << (s - 103u);  // normal, or subnormal 2^(s-127)
  }
}

}  // namespace dequantd::mxfp4_pairs
