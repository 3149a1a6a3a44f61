// Element types (DType) and the exact scalar conversions between them, shared by every format's
// reference, CPU path and kernels (host and device). No format knowledge here.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__CUDACC__)
#define DEQUANTD_HD __host__ __device__ __forceinline__
#else
#define DEQUANTD_HD inline
#endif

namespace dequantd {

// Element types on the wire, on disk and in memory.
// kI64 is a stored tensor's dtype only (compressed-tensors' weight_shape), never a result's;
// kF8E4M3: OCP float8 E4M3FN (torch.float8_e4m3fn, safetensors F8_E4M3), a stored dtype only.
// kU8: bytes (safetensors U8; MXFP4's packed E2M1 pairs and E8M0 scales), a stored dtype only.
enum class DType : int { kF16 = 0, kBF16 = 1, kF32 = 2, kI32 = 3, kI64 = 4, kF8E4M3 = 5, kU8 = 6 };

constexpr int64_t DTypeSize(DType t) {
  return t == DType::kI64                         ? 8
         : t == DType::kF32 || t == DType::kI32   ? 4
         : t == DType::kF8E4M3 || t == DType::kU8 ? 1
                                                  : 2;
}
// "fp16", "bf16", "fp32", "int32", "int64", "fp8_e4m3", "uint8".
std::string_view DTypeName(DType t);
// Accepts "fp16"/"float16"/"F16", "bf16"/"bfloat16"/"BF16", "fp32"/"float32"/"F32", "int32"/"I32",
// "int64"/"I64", "fp8_e4m3"/"float8_e4m3fn"/"F8_E4M3", "uint8"/"U8".
bool ParseDType(std::string_view name, DType* out);

// ---- Exact scalar conversions (host and device), used by the CPU reference. -----------------

DEQUANTD_HD uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
DEQUANTD_HD float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// float(v) for v < 2^23, exactly, without an integer-to-float conversion: 2^23 + v is a float
// whose low mantissa bits are v, and subtracting 2^23 is exact. On the GPU one FADD at full rate
// where I2F runs at a quarter of it (the formats' kernels are conversion-bound otherwise).
DEQUANTD_HD float SmallUintToFloat(uint32_t v) { return BitsToFloat(0x4B000000u | v) - 8388608.0f; }

// IEEE binary16 bits -> float (exact: every half is a float).
DEQUANTD_HD float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return BitsToFloat(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in float.
  const float mag = static_cast<float>(mant) * 5.9604644775390625e-08f;
  return BitsToFloat(sign | FloatBits(mag));
}

// float -> IEEE binary16 bits, round to nearest even; overflow -> inf; NaN -> a quiet NaN.
DEQUANTD_HD uint16_t FloatToHalfBitsRne(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to inf (incl. inf)
  if (abs < 0x38800000u) {                        // below 2^-14: half subnormal or zero
    // value = abs_float; half subnormal unit is 2^-24. Round abs/2^-24 to nearest even integer.
    const uint32_t exp = abs >> 23;
    if (exp < 102) return sign;  // < 2^-25: rounds to zero (exactly 2^-25 is a tie -> even 0)
    const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;  // value = mant * 2^(exp-150)
    const uint32_t shift = 126u - exp;                    // to units of 2^-24: >> (126 - exp)
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  // Normal half: rebias exponent, round 13 dropped mantissa bits to nearest even.
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry into exponent is correct
  return sign | static_cast<uint16_t>(h);
}

// float8 E4M3FN bits -> float (exact): sign bit 7, exponent bits 6-3 (bias 7), mantissa bits 2-0;
// exponent 0 is subnormal (m * 2^-9); 0x7F / 0xFF are NaN (returned as a quiet NaN of that
// sign); no infinities; the largest finite magnitude is 0x7E = 448.
DEQUANTD_HD float Fp8E4m3BitsToFloat(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xFu;
  const uint32_t mant = b & 0x7u;
  if (exp == 0xFu && mant == 0x7u) return BitsToFloat(sign | 0x7FC00000u);  // NaN
  if (exp != 0) return BitsToFloat(sign | ((exp + 120u) << 23) | (mant << 20));
  // Zero or subnormal: mant * 2^-9, exact in float.
  return BitsToFloat(sign | FloatBits(SmallUintToFloat(mant) * 0.001953125f));
}

// bfloat16 bits -> float (exact).
DEQUANTD_HD float Bf16BitsToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

// float -> bfloat16 bits, round to nearest even; NaN -> a quiet NaN.
DEQUANTD_HD uint16_t FloatToBf16BitsRne(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

}  // namespace dequantd
