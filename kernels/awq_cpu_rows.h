// Row kernels of the fast CPU path (private to awq_cpu.cc): dequantize one row segment of
// `words` packed words (8 * words output columns) given the group's zero points and scales
// already widened to float per column. Each returns exactly what DequantizeReference returns:
//   out[j] = round_out((float(q[j]) - zero[j]) * scale[j]),
// where float(q) - float(z) is exact (small integers), so the product equals float(q - z) * s.
// Row<kOut, kFiniteScales>: kFiniteScales promises every scale[j] is finite, so no product is
// NaN (q - z is a finite integer; overflow gives inf) and NaN handling can be left out.
#pragma once

#include <cstdint>

#include "kernels/awq_format.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DEQUANTD_CPU_X86 1
#endif

namespace dequantd::cpu {

// FloatToHalfBitsRne without data-dependent branches (the reference's version branches on the
// rounding remainder, which mispredicts half the time on real data). Same bits for every input:
// subnormal results come from one float addition of 0.5, whose rounding to a multiple of 2^-24
// is exactly the half subnormal rounding (F. Giesen, "float_to_half_fast3_rtne"); normal results
// from adding the rebias and 0xFFF plus the kept mantissa's lowest bit before shifting out 13
// bits (a carry into the exponent is correct, up to inf at 65520); NaN gives sign | 0x7E00.
inline uint16_t FloatToHalfBitsRneSelect(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7FFFFFFFu;
  const uint32_t normal = (abs - (112u << 23) + 0xFFFu + ((abs >> 13) & 1u)) >> 13;
  const uint32_t subnormal = FloatBits(BitsToFloat(abs) + 0.5f) - FloatBits(0.5f);
  // Selects as masks (all ones when the condition holds): no control flow to vectorize around.
  const uint32_t tiny = 0u - static_cast<uint32_t>(abs < 0x38800000u);   // below 2^-14
  const uint32_t huge = 0u - static_cast<uint32_t>(abs >= 0x477FF000u);  // >= 65520, inf, NaN
  const uint32_t nan = 0u - static_cast<uint32_t>(abs > 0x7F800000u);
  uint32_t h = (subnormal & tiny) | (normal & ~tiny);
  h = (0x7C00u & huge) | (h & ~huge);
  h |= 0x0200u & nan;  // 0x7C00 | 0x0200 = 0x7E00
  return static_cast<uint16_t>(sign | h);
}

// FloatToBf16BitsRne with the NaN case as a select instead of an early return, so loops using
// it vectorize. Same bits for every input.
inline uint16_t FloatToBf16BitsRneSelect(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

// Output element type and its scalar rounding (bit-identical to awq_format.h's), per dtype.
template <DType kOut>
struct OutTraits {
  using T = uint16_t;
  static T FromFloat(float w) {
    return kOut == DType::kF16 ? FloatToHalfBitsRneSelect(w) : FloatToBf16BitsRneSelect(w);
  }
};
template <>
struct OutTraits<DType::kF32> {
  using T = float;
  static T FromFloat(float w) { return w; }
};

// Portable: per word, eight shifts by the constant nibble positions into a small float array,
// then a fixed-length loop of subtract, multiply and branch-free rounding that the compiler can
// vectorize for the target's baseline ISA (SSE2, NEON).
struct PortableRows {
  template <DType kOut, bool kFiniteScales>
  static void Row(const int32_t* qrow, int64_t words, const float* __restrict zero,
                  const float* __restrict scale, typename OutTraits<kOut>::T* __restrict out) {
    for (int64_t c = 0; c < words; ++c) {
      const auto w = static_cast<uint32_t>(qrow[c]);
      const int64_t base = c * awq::kPackFactor;
      float q[awq::kPackFactor];
      for (int i = 0; i < awq::kPackFactor; ++i) {
        q[i] = static_cast<float>((w >> (awq::kBits * awq::kNibbleOfColumn[i])) & awq::kNibbleMask);
      }
      for (int i = 0; i < awq::kPackFactor; ++i) {
        out[base + i] = OutTraits<kOut>::FromFloat((q[i] - zero[base + i]) * scale[base + i]);
      }
    }
  }
  static void Finish() {}
};

#if defined(DEQUANTD_CPU_X86)
#define DEQUANTD_AVX2 __attribute__((target("avx2,f16c")))

// AVX2 + F16C building blocks: one 8-lane vector per packed word. A variable shift (vpsrlvd)
// by 4 * kNibbleOfColumn puts column i's nibble in lane i; fp16 rounding is the hardware's
// round-to-nearest-even conversion (vcvtps2ph), bf16 rounding is done in integer lanes.
struct Avx2Ops {
  DEQUANTD_AVX2 static __m256 Dequant8(uint32_t word, const float* zero, const float* scale) {
    const __m256i shifts = _mm256_setr_epi32(
        awq::kBits * awq::kNibbleOfColumn[0], awq::kBits * awq::kNibbleOfColumn[1],
        awq::kBits * awq::kNibbleOfColumn[2], awq::kBits * awq::kNibbleOfColumn[3],
        awq::kBits * awq::kNibbleOfColumn[4], awq::kBits * awq::kNibbleOfColumn[5],
        awq::kBits * awq::kNibbleOfColumn[6], awq::kBits * awq::kNibbleOfColumn[7]);
    const __m256i q =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts),
                         _mm256_set1_epi32(static_cast<int>(awq::kNibbleMask)));
    return _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(zero)),
                         _mm256_loadu_ps(scale));
  }

  // fp16: NaN lanes become sign | quiet NaN with an empty payload first, so vcvtps2ph gives
  // sign | 0x7E00 exactly as FloatToHalfBitsRne does. kNoNan: the caller knows no lane is NaN.
  template <bool kNoNan>
  DEQUANTD_AVX2 static __m128i ToHalf8(__m256 w) {
    if constexpr (kNoNan) return _mm256_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT);
    const __m256 nan = _mm256_cmp_ps(w, w, _CMP_UNORD_Q);
    const __m256 canonical = _mm256_or_ps(_mm256_and_ps(w, _mm256_set1_ps(-0.0f)),
                                          _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)));
    return _mm256_cvtps_ph(_mm256_blendv_ps(w, canonical, nan), _MM_FROUND_TO_NEAREST_INT);
  }

  // bf16 bits in the low 16 bits of each 32-bit lane: FloatToBf16BitsRne, lane-wise.
  template <bool kNoNan>
  DEQUANTD_AVX2 static __m256i ToBf16x8Wide(__m256 w) {
    const __m256i u = _mm256_castps_si256(w);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
    if constexpr (kNoNan) return rounded;
    const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
    return _mm256_blendv_epi8(rounded, quiet, nan);
  }

  // Stores the eight columns of one word. kStream: non-temporal stores, which skip the
  // read-for-ownership of the output lines; `out` must then be 16-byte aligned.
  template <DType kOut, bool kStream, bool kNoNan>
  DEQUANTD_AVX2 static void Store8(__m256 w, typename OutTraits<kOut>::T* out) {
    if constexpr (kOut == DType::kF32) {
      if constexpr (kStream) {  // two 16-byte halves: needs only 16-byte alignment
        _mm_stream_ps(out, _mm256_castps256_ps128(w));
        _mm_stream_ps(out + 4, _mm256_extractf128_ps(w, 1));
      } else {
        _mm256_storeu_ps(out, w);
      }
    } else {
      __m128i packed;
      if constexpr (kOut == DType::kF16) {
        packed = ToHalf8<kNoNan>(w);
      } else {
        const __m256i wide = ToBf16x8Wide<kNoNan>(w);
        packed = _mm_packus_epi32(_mm256_castsi256_si128(wide), _mm256_extracti128_si256(wide, 1));
      }
      if constexpr (kStream) {
        _mm_stream_si128(reinterpret_cast<__m128i*>(out), packed);
      } else {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), packed);
      }
    }
  }
};

// The AVX2 row kernel; kStream selects non-temporal stores (see Avx2Ops::Store8).
template <bool kStream>
struct Avx2Rows {
  template <DType kOut, bool kFiniteScales>
  DEQUANTD_AVX2 static void Row(const int32_t* qrow, int64_t words, const float* zero,
                                const float* scale, typename OutTraits<kOut>::T* out) {
    for (int64_t c = 0; c < words; ++c) {
      const int64_t base = c * awq::kPackFactor;
      Avx2Ops::Store8<kOut, kStream, kFiniteScales>(
          Avx2Ops::Dequant8(static_cast<uint32_t>(qrow[c]), zero + base, scale + base), out + base);
    }
  }
  // Orders this thread's non-temporal stores before whatever follows (e.g. the thread's join).
  static void Finish() {
    if constexpr (kStream) _mm_sfence();
  }
};
#undef DEQUANTD_AVX2
#endif  // DEQUANTD_CPU_X86

}  // namespace dequantd::cpu
