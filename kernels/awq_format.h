// The AWQ 4-bit GEMM checkpoint format, written down once. The CPU reference, every CUDA kernel,
// the validator and the checkpoint loader include this header; nothing else restates the layout.
//
// Source: AutoAWQ's "gemm" version (awq/modules/linear/gemm.py, WQLinear_GEMM.from_linear), the
// layout vLLM's `awq` quantization method reads (vllm/model_executor/layers/quantization/awq.py,
// AWQ_REVERSE_ORDER in awq_triton.py). For a linear layer with in_features K, out_features N and
// group size G (K % G == 0; a checkpoint's `group_size: -1` means G = K):
//   qweight: (K, N/8)   int32, row-major. Eight 4-bit unsigned weights per word.
//   qzeros:  (K/G, N/8) int32, row-major. Eight 4-bit unsigned zero points per word.
//   scales:  (K/G, N)   fp16 (bf16 accepted), row-major.
// Within a word of row r and word-column c, output column 8c + kColumnOfNibble[j] sits in bits
// [4j, 4j+4); equivalently column 8c + i sits in nibble kNibbleOfColumn[i] = [0,4,1,5,2,6,3,7].
//
// Dequantization (the definition every path must reproduce bit for bit):
//   w[k, n] = round_out( float(q[k, n] - z[k/G, n]) * float(s[k/G, n]) )
// q - z is an integer in [-15, 15] and s has at most 11 significant bits, so the fp32 product is
// exact; it is rounded once, round-to-nearest-even, to the output dtype (fp16 overflow gives inf,
// subnormals are kept, NaN scales give a NaN whose payload is unspecified, 0 * negative scale
// gives -0). fp32 output is exact.
#pragma once

#include <array>
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
enum class DType : int { kF16 = 0, kBF16 = 1, kF32 = 2, kI32 = 3 };

constexpr int64_t DTypeSize(DType t) { return t == DType::kF32 || t == DType::kI32 ? 4 : 2; }
// "fp16", "bf16", "fp32", "int32".
std::string_view DTypeName(DType t);
// Accepts "fp16"/"float16"/"F16", "bf16"/"bfloat16"/"BF16", "fp32"/"float32"/"F32", "int32"/"I32".
bool ParseDType(std::string_view name, DType* out);

namespace awq {

inline constexpr int kBits = 4;
inline constexpr int kPackFactor = 32 / kBits;  // weights per int32 word
inline constexpr uint32_t kNibbleMask = (1u << kBits) - 1;
// kNibbleOfColumn[i]: the nibble holding output column 8c + i.
inline constexpr std::array<int, kPackFactor> kNibbleOfColumn = {0, 4, 1, 5, 2, 6, 3, 7};
// kColumnOfNibble[j]: the output column (within the word's 8) held by nibble j (AutoAWQ order_map).
inline constexpr std::array<int, kPackFactor> kColumnOfNibble = {0, 2, 4, 6, 1, 3, 5, 7};

static_assert(kPackFactor == 8, "AWQ GEMM packs eight 4-bit values per int32");
static_assert(
    [] {
      for (int i = 0; i < kPackFactor; ++i)
        if (kColumnOfNibble[kNibbleOfColumn[i]] != i) return false;
      return true;
    }(),
    "kNibbleOfColumn and kColumnOfNibble must be inverse permutations");

// kNibbleOfColumn as one word: nibble i of this constant is kNibbleOfColumn[i]. (Checked here,
// outside any __host__ __device__ function, so nvcc needs no relaxed constexpr for it.)
inline constexpr uint32_t kNibbleOfColumnPacked = 0x73625140u;
static_assert(
    [] {
      for (int i = 0; i < kPackFactor; ++i)
        if (((kNibbleOfColumnPacked >> (4 * i)) & 0xFu) !=
            static_cast<uint32_t>(kNibbleOfColumn[i]))
          return false;
      return true;
    }(),
    "kNibbleOfColumnPacked must spell kNibbleOfColumn");

// The 4-bit field of `word` that holds output column 8c + i (i in [0, 8)).
DEQUANTD_HD uint32_t NibbleForColumn(uint32_t word, int i) {
  return (word >> (4u * ((kNibbleOfColumnPacked >> (4 * i)) & 0xFu))) & kNibbleMask;
}

}  // namespace awq

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
