// Device-side decode helpers for the AWQ GEMM format (layer 1 of the kernels: no kernels here).
// The layout and the rounding rule come from kernels/awq_format.h; every helper reproduces
//   w = round_out(float(q - z) * float(s))
// bit for bit. Two families:
//   * scalar helpers (one output element at a time), used by v1-v3;
//   * word helpers (the 8 outputs of one packed int32 word at a time, as 16-byte vectors), used by
//     v4. They unpack nibbles with one shift + one LOP3 per output pair (Lop3Unpack) and compute
//     (q - z) exactly in half precision, then multiply once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/awq_format.h"

namespace dequantd::cuda {

// ---- Scalar helpers ---------------------------------------------------------------------------

// A 16-bit scale (fp16 or bf16 bits) as a float (exact).
template <DType kScale>
__device__ __forceinline__ float ScaleBitsToFloat(uint16_t bits) {
  static_assert(kScale == DType::kF16 || kScale == DType::kBF16);
  if constexpr (kScale == DType::kF16) {
    return __half2float(__ushort_as_half(bits));
  } else {
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  }
}

// Scale element `i` of `scales` (fp16, bf16 or fp32 elements) as a float (exact).
template <DType kScale>
__device__ __forceinline__ float LoadScaleAsFloat(const void* scales, int64_t i) {
  static_assert(kScale == DType::kF16 || kScale == DType::kBF16 || kScale == DType::kF32);
  if constexpr (kScale == DType::kF32) {
    return __ldg(static_cast<const float*>(scales) + i);
  } else {
    return ScaleBitsToFloat<kScale>(__ldg(static_cast<const unsigned short*>(scales) + i));
  }
}

// float(q - z) * s for output column 8c + i of a (qweight, qzeros) word pair. The product is exact
// in fp32 (|q - z| <= 15 has 4 significant bits, s at most 11).
__device__ __forceinline__ float DequantElement(uint32_t qword, uint32_t zword, int i, float s) {
  const int q = static_cast<int>(awq::NibbleForColumn(qword, i));
  const int z = static_cast<int>(awq::NibbleForColumn(zword, i));
  return __int2float_rn(q - z) * s;
}

// Rounds `v` once (round to nearest even) to kOut and stores it as element `i` of `out`.
template <DType kOut>
__device__ __forceinline__ void StoreElement(void* out, int64_t i, float v) {
  if constexpr (kOut == DType::kF16) {
    static_cast<__half*>(out)[i] = __float2half_rn(v);
  } else if constexpr (kOut == DType::kBF16) {
    static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
  } else {
    static_assert(kOut == DType::kF32);
    static_cast<float*>(out)[i] = v;
  }
}

// ---- Word helpers (8 outputs of one packed word) ---------------------------------------------

// Lop3Unpack: nibbles j and j + 4 of `word` (output columns 8c + 2j and 8c + 2j + 1) placed in the
// low mantissa bits of a pair of 16-bit floats whose other bits are `magic`:
//   fp16 magic 0x64006400 -> half2     (1024 + q[2j], 1024 + q[2j+1])
//   bf16 magic 0x43004300 -> bfloat162 ( 128 + q[2j],  128 + q[2j+1])
// in memory order (low half = lower column). One shift and one LOP3 per pair.
inline constexpr uint32_t kF16Magic = 0x64006400u;   // 1024.0 in each fp16 half
inline constexpr uint32_t kBf16Magic = 0x43004300u;  // 128.0 in each bf16 half
static_assert(awq::kColumnOfNibble[0] == 0 && awq::kColumnOfNibble[4] == 1 &&
                  awq::kColumnOfNibble[1] == 2 && awq::kColumnOfNibble[5] == 3 &&
                  awq::kColumnOfNibble[2] == 4 && awq::kColumnOfNibble[6] == 5 &&
                  awq::kColumnOfNibble[3] == 6 && awq::kColumnOfNibble[7] == 7,
              "Lop3Unpack relies on nibbles (j, j+4) holding columns (2j, 2j+1)");

__device__ __forceinline__ uint32_t Lop3Unpack(uint32_t word, int j, uint32_t magic) {
  return ((word >> (4 * j)) & 0x000F000Fu) | magic;
}

__device__ __forceinline__ __half2 AsHalf2(uint32_t u) {
  __half2 h;
  static_assert(sizeof h == sizeof u);
  memcpy(&h, &u, sizeof h);
  return h;
}
__device__ __forceinline__ __nv_bfloat162 AsBfloat162(uint32_t u) {
  __nv_bfloat162 h;
  memcpy(&h, &u, sizeof h);
  return h;
}
template <class T>
__device__ __forceinline__ uint32_t AsU32(T v) {
  static_assert(sizeof(T) == 4);
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

// The 8 outputs of one word, in memory order: 16 bytes for fp16/bf16, 32 for fp32.
template <DType kOut>
struct OutWord {
  static constexpr int kVectors = kOut == DType::kF32 ? 2 : 1;  // 16-byte vectors
  uint4 v[kVectors];
};

// Dequantizes whole words of one word-column c for one group: built once from the group's zero
// word and 8 scales (loaded as one 16-byte vector), then applied to every qweight word of that
// column in the group. Exactness:
//   * kScale == kOut (fp16 -> fp16, bf16 -> bf16): (bias + q) - (bias + z) is exact in 16-bit
//     floats (integers of magnitude <= 143), and one correctly rounded 16-bit multiply of the exact
//     difference by s equals round_out(float(q - z) * float(s)), the reference's definition. The
//     fused form q*s - z*s would round twice and is never used.
//   * otherwise: the exact difference is widened to float, multiplied exactly in fp32 and rounded
//     once by a cvt.rn (or stored as is for fp32 output).
template <DType kScale, DType kOut>
class WordDequantizer {
 public:
  static constexpr bool kNative = kScale == kOut;  // 16-bit packed arithmetic path

  __device__ __forceinline__ WordDequantizer(uint32_t zword, uint4 scales8) {
    const uint32_t s[4] = {scales8.x, scales8.y, scales8.z, scales8.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (kNative) {
        zero_[j] = Lop3Unpack(zword, j, kMagic);
        scale_[j] = s[j];
      } else {
        zero_[j] = Lop3Unpack(zword, j, kF16Magic);
        if constexpr (kScale == DType::kF16) {
          const float2 f = __half22float2(AsHalf2(s[j]));
          scale_f_[2 * j] = f.x;
          scale_f_[2 * j + 1] = f.y;
        } else {
          scale_f_[2 * j] = __uint_as_float(s[j] << 16);
          scale_f_[2 * j + 1] = __uint_as_float(s[j] & 0xFFFF0000u);
        }
      }
    }
  }

  // Output columns 2j and 2j + 1 of `qword` (j in [0, 4)): for fp16/bf16 output their rounded
  // bits in one word (column 2j in the low half), for fp32 output the two values.
  using PairOut = std::conditional_t<kOut == DType::kF32, float2, uint32_t>;
  __device__ __forceinline__ PairOut Pair(uint32_t qword, int j) const {
    if constexpr (kNative && kOut == DType::kF16) {
      const __half2 diff = __hsub2_rn(AsHalf2(Lop3Unpack(qword, j, kMagic)), AsHalf2(zero_[j]));
      return AsU32(__hmul2_rn(diff, AsHalf2(scale_[j])));
    } else if constexpr (kNative) {
      const __nv_bfloat162 diff =
          __hsub2_rn(AsBfloat162(Lop3Unpack(qword, j, kMagic)), AsBfloat162(zero_[j]));
      return AsU32(__hmul2_rn(diff, AsBfloat162(scale_[j])));
    } else {
      const float2 d =
          __half22float2(__hsub2_rn(AsHalf2(Lop3Unpack(qword, j, kF16Magic)), AsHalf2(zero_[j])));
      const float2 wide =
          make_float2(__fmul_rn(d.x, scale_f_[2 * j]), __fmul_rn(d.y, scale_f_[2 * j + 1]));
      if constexpr (kOut == DType::kF16) {
        return AsU32(__floats2half2_rn(wide.x, wide.y));
      } else if constexpr (kOut == DType::kBF16) {
        return AsU32(__floats2bfloat162_rn(wide.x, wide.y));
      } else {
        return wide;
      }
    }
  }

  __device__ __forceinline__ OutWord<kOut> operator()(uint32_t qword) const {
    OutWord<kOut> out;
    PairOut pair[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) pair[j] = Pair(qword, j);
    if constexpr (kOut == DType::kF32) {
      out.v[0] = make_uint4(__float_as_uint(pair[0].x), __float_as_uint(pair[0].y),
                            __float_as_uint(pair[1].x), __float_as_uint(pair[1].y));
      out.v[1] = make_uint4(__float_as_uint(pair[2].x), __float_as_uint(pair[2].y),
                            __float_as_uint(pair[3].x), __float_as_uint(pair[3].y));
    } else {
      out.v[0] = make_uint4(pair[0], pair[1], pair[2], pair[3]);
    }
    return out;
  }

 private:
  static constexpr uint32_t kMagic = kOut == DType::kBF16 ? kBf16Magic : kF16Magic;
  uint32_t zero_[4];
  uint32_t scale_[kNative ? 4 : 1];
  float scale_f_[kNative ? 1 : 8];
};

}  // namespace dequantd::cuda
