// kernels/nibble_pairs.h on the host (no GPU): the lop3 / prmt emulation against the PTX
// definitions; every pair helper's nibble placement for every input byte that reaches it (all 2^16
// byte pairs for the two-word helpers), with the other bytes random; the zero subtraction exact for
// all 16 x 16 (q, z) in every form; the claim that the fp32 product of q - z and any fp16 / bf16
// scale is exact (so one correctly rounded packed multiply is the formats' rounding); and the
// kernels' compositions (compressed-tensors' CtNkInt4PairChunks, GPTQ's (K, N) KnPairDecode),
// mirrored here with the packed arithmetic emulated, against each format's CPU reference. The GPU
// run (tests/cuda) checks the kernels themselves against the same references.
#include "kernels/nibble_pairs.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "kernels/compressed_tensors_format.h"
#include "kernels/dequant.h"
#include "kernels/dtype.h"
#include "kernels/gptq_format.h"

namespace dequantd {
namespace {

namespace np = nibble_pairs;

// Code m (bits [4m, 4m + 4)) of a sequential word.
uint32_t Code(uint32_t word, int m) { return (word >> (4 * m)) & 0xFu; }

uint16_t Half(uint32_t pair, int h) { return static_cast<uint16_t>(pair >> (16 * h)); }

// The value of a 16-bit float of `dtype` (fp16 or bf16), exactly.
float Value(uint16_t bits, DType dtype) {
  return dtype == DType::kBF16 ? Bf16BitsToFloat(bits) : HalfBitsToFloat(bits);
}
uint16_t RoundTo(float v, DType dtype) {
  return dtype == DType::kBF16 ? FloatToBf16BitsRne(v) : FloatToHalfBitsRne(v);
}

// ---- The instructions ---------------------------------------------------------------------------

// Lop3<kLut>(0xF0, 0xCC, 0xAA) for every kLut: PTX defines immLut = F(0xF0, 0xCC, 0xAA), so
// feeding those three constants returns the table itself.
template <size_t... kLuts>
std::array<uint32_t, sizeof...(kLuts)> LutsOfTheConstants(std::index_sequence<kLuts...>) {
  return {np::Lop3<kLuts>(0xF0u, 0xCCu, 0xAAu)...};
}

TEST(NibblePairsTest, Lop3IsThePtxLookUpTable) {
  const std::array<uint32_t, 256> luts = LutsOfTheConstants(std::make_index_sequence<256>());
  for (uint32_t lut = 0; lut < 256; ++lut) {
    EXPECT_EQ(luts[lut] & 0xFFu, lut);
    EXPECT_EQ(luts[lut] >> 8, (lut & 1u) != 0 ? 0xFFFFFFu : 0u);  // bits 8-31: F(0, 0, 0)
  }
  std::mt19937 rng(1);
  for (int t = 0; t < 10000; ++t) {
    const uint32_t a = rng(), b = rng(), c = rng();
    EXPECT_EQ(np::Lop3<np::kAndOr>(a, b, c), (a & b) | c);
    EXPECT_EQ(np::Lop3<0x96>(a, b, c), a ^ b ^ c);
    EXPECT_EQ(np::Lop3<0xF0>(a, b, c), a);
  }
}

TEST(NibblePairsTest, PrmtIsThePtxBytePermute) {
  const uint32_t a = 0x33221100u, b = 0x77665544u;
  EXPECT_EQ(np::Prmt(a, b, 0x3210u), a);
  EXPECT_EQ(np::Prmt(a, b, 0x7654u), b);
  EXPECT_EQ(np::Prmt(a, b, 0x5140u), 0x55114400u);
  EXPECT_EQ(np::Prmt(a, b, 0x0123u), 0x00112233u);
  EXPECT_EQ(np::Prmt(0x80u, 0u, 0x4448u), 0x000000FFu);  // sign replication (unused below)
  EXPECT_EQ(np::Prmt(0x7Fu, 0u, 0x4448u), 0u);
  EXPECT_EQ(np::Prmt(0x7Fu, 0u, 0x0000u), 0x7F7F7F7Fu);
  for (int i = 0; i < 4; ++i) {
    const uint32_t t = np::Prmt(a, b, np::SplitByteSelector(i));
    EXPECT_EQ(t & 0xFFu, 0x11u * static_cast<uint32_t>(i)) << i;              // byte i of a
    EXPECT_EQ((t >> 16) & 0xFFu, 0x11u * static_cast<uint32_t>(4 + i)) << i;  // byte i of b
  }
}

// ---- Placement ----------------------------------------------------------------------------------

// Words to try: every 16-bit pattern in the byte that matters, the other bytes random.
template <class F>
void ForEveryByteValue(int byte, F&& f) {
  std::mt19937 rng(static_cast<uint32_t>(byte) + 7);
  for (uint32_t v = 0; v < 256; ++v) {
    for (int t = 0; t < 16; ++t) {
      const uint32_t mask = 0xFFu << (8 * byte);
      f((static_cast<uint32_t>(rng()) & ~mask) | v << (8 * byte));
    }
  }
}

TEST(NibblePairsTest, SequentialPairsHoldCodes2iAnd2iPlus1InTheirForms) {
  for (int i = 0; i < 4; ++i) {
    ForEveryByteValue(i, [&](uint32_t w) {
      const uint32_t lo = Code(w, 2 * i), hi = Code(w, 2 * i + 1);
      const uint32_t mixed = np::SeqPairF16LoHi(w, i);
      EXPECT_EQ(Half(mixed, 0), np::kF16Lo | lo);
      EXPECT_EQ(Half(mixed, 1), np::kF16Hi | hi << 4);
      EXPECT_EQ(Value(Half(mixed, 0), DType::kF16), 1024.0f + lo);
      EXPECT_EQ(Value(Half(mixed, 1), DType::kF16), 64.0f + hi);
      const uint32_t f16_lo = np::SeqPairF16Lo(w, w >> 4, i);
      EXPECT_EQ(Value(Half(f16_lo, 0), DType::kF16), 1024.0f + lo);
      EXPECT_EQ(Value(Half(f16_lo, 1), DType::kF16), 1024.0f + hi);
      const uint32_t f16_hi = np::SeqPairF16Hi(w << 4, w, i);
      EXPECT_EQ(Value(Half(f16_hi, 0), DType::kF16), 64.0f + lo);
      EXPECT_EQ(Value(Half(f16_hi, 1), DType::kF16), 64.0f + hi);
      const uint32_t bf16 = np::SeqPairBf16(w, w >> 4, i);
      EXPECT_EQ(Half(bf16, 0), np::kBf16Lo | lo);
      EXPECT_EQ(Half(bf16, 1), np::kBf16Lo | hi);
      EXPECT_EQ(Value(Half(bf16, 0), DType::kBF16), 128.0f + lo);
      EXPECT_EQ(Value(Half(bf16, 1), DType::kBF16), 128.0f + hi);
    });
  }
}

TEST(NibblePairsTest, CrossPairsHoldCodeJOfBothWordsForAllBytePairs) {
  std::mt19937 rng(3);
  for (int b = 0; b < 4; ++b) {
    for (uint32_t v = 0; v < 65536; ++v) {  // (byte b of x, byte b of y): every pair
      const uint32_t mask = 0xFFu << (8 * b);
      const uint32_t x = (static_cast<uint32_t>(rng()) & ~mask) | (v & 0xFFu) << (8 * b);
      const uint32_t y = (static_cast<uint32_t>(rng()) & ~mask) | (v >> 8) << (8 * b);
      const uint32_t t = np::CrossBytes(x, y, b);
      for (int odd = 0; odd < 2; ++odd) {
        const int j = 2 * b + odd;
        const uint32_t f16 = np::CrossPairF16(t, odd != 0);
        const float base = odd ? 64.0f : 1024.0f;
        ASSERT_EQ(Value(Half(f16, 0), DType::kF16), base + Code(x, j)) << x << " " << j;
        ASSERT_EQ(Value(Half(f16, 1), DType::kF16), base + Code(y, j)) << y << " " << j;
        // The zero pairs of the same rows use the same form (KnPairDecode::ZeroPairs).
        const uint32_t zero_form =
            odd ? np::SeqPairF16Hi(x << 4, x, 0) : np::SeqPairF16Lo(x, x >> 4, 0);
        ASSERT_EQ(Half(f16, 0) & 0xFF00u, Half(zero_form, 0) & 0xFF00u);
        const uint32_t bf16 = np::CrossPairBf16(t, odd != 0);
        ASSERT_EQ(Value(Half(bf16, 0), DType::kBF16), 128.0f + Code(x, j));
        ASSERT_EQ(Value(Half(bf16, 1), DType::kBF16), 128.0f + Code(y, j));
      }
    }
  }
}

// ---- Arithmetic ---------------------------------------------------------------------------------

// (base + q) - (base + z) in every form is q - z, and q - z is a value of the dtype, so the
// correctly rounded packed subtraction returns it exactly.
TEST(NibblePairsTest, ZeroSubtractionIsExactForAll16x16) {
  struct Form {
    uint32_t magic;
    DType dtype;
  };
  for (const Form form : {Form{np::kF16Lo, DType::kF16}, Form{np::kF16Hi, DType::kF16},
                          Form{np::kBf16Lo, DType::kBF16}}) {
    for (uint32_t q = 0; q < 16; ++q) {
      for (uint32_t z = 0; z < 16; ++z) {
        const uint32_t qp = np::ZeroPair(q, q, form.magic, form.magic);
        const uint32_t zp = np::ZeroPair(z, z, form.magic, form.magic);
        for (int h = 0; h < 2; ++h) {
          const float d = Value(Half(qp, h), form.dtype) - Value(Half(zp, h), form.dtype);
          EXPECT_EQ(d, static_cast<float>(static_cast<int>(q) - static_cast<int>(z)));
          EXPECT_EQ(Value(RoundTo(d, form.dtype), form.dtype), d);
        }
      }
    }
  }
  // The compressed-tensors zero pair (kF16Lo, kF16Hi) against SeqPairF16LoHi's halves.
  for (uint32_t z = 0; z < 16; ++z) {
    const uint32_t zp = np::ZeroPair(z, z, np::kF16Lo, np::kF16Hi);
    EXPECT_EQ(Value(Half(zp, 0), DType::kF16), 1024.0f + z);
    EXPECT_EQ(Value(Half(zp, 1), DType::kF16), 64.0f + z);
  }
}

// float(q - z) * float(s) is exact in fp32 for every |q - z| <= 15 and every finite fp16 or bf16
// scale, or (bf16 only) overflows fp32, where the exact product also lies beyond bf16's overflow
// threshold: either way the correctly rounded fp16 / bf16 multiply (mul.rn) equals rounding the
// fp32 product, the formats' definition.
TEST(NibblePairsTest, ProductOfDifferenceAndAnyScaleIsExactInFloat) {
  const double bf16_overflow = std::ldexp(2.0 - std::ldexp(1.0, -8), 127);  // max + half an ulp
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    for (uint32_t bits = 0; bits < 65536; ++bits) {
      const float s = Value(static_cast<uint16_t>(bits), dtype);
      if (!std::isfinite(s)) continue;
      for (int d = -15; d <= 15; ++d) {
        const float product = static_cast<float>(d) * s;
        const double exact = static_cast<double>(d) * static_cast<double>(s);
        if (std::isinf(product)) {
          ASSERT_EQ(dtype, DType::kBF16) << bits << " " << d;
          ASSERT_GE(std::fabs(exact), bf16_overflow) << bits << " " << d;
          ASSERT_EQ(std::signbit(product), std::signbit(exact));
        } else {
          ASSERT_EQ(static_cast<double>(product), exact)
              << DTypeName(dtype) << " " << bits << " " << d;
        }
      }
    }
  }
}

// ---- The kernels' compositions, mirrored -------------------------------------------------------

// SubPairs / MulPairs / WidenPair + PackPair of kernels/cuda/half2_pairs.cuh on the host: each half
// rounded once from the exact float result (exact for the operands used: the tests above).
uint32_t PairOp(uint32_t a, uint32_t b, DType dtype, bool multiply) {
  uint32_t r = 0;
  for (int h = 0; h < 2; ++h) {
    const float x = Value(Half(a, h), dtype), y = Value(Half(b, h), dtype);
    r |= static_cast<uint32_t>(RoundTo(multiply ? x * y : x - y, dtype)) << (16 * h);
  }
  return r;
}

// Stores value `v` (already a value of `from`) as element `e` of `out` in `out_dtype`.
void Store(std::vector<uint8_t>& out, DType out_dtype, int64_t e, float v) {
  if (out_dtype == DType::kF32) {
    std::memcpy(&out[static_cast<size_t>(4 * e)], &v, 4);
  } else {
    const uint16_t bits = RoundTo(v, out_dtype);
    std::memcpy(&out[static_cast<size_t>(2 * e)], &bits, 2);
  }
}

// compressed-tensors (N, K) int4 without g_idx: CtNkInt4PairChunks, chunk by chunk.
TEST(NibblePairsTest, CompressedTensorsPairChunksMatchTheReference) {
  namespace ct = compressed_tensors;
  constexpr int64_t K = 64, N = 24, G = 16;
  std::mt19937 rng(11);
  for (const DType scale_dtype : {DType::kF16, DType::kBF16}) {
    for (const uint32_t flags : {ct::kNoGidx, ct::kNoGidx | ct::kSym}) {
      const QuantShape shape = ct::MakeShape(K, N, G, 4, flags, scale_dtype);
      std::vector<int32_t> packed(static_cast<size_t>(N * K / 8));
      for (int32_t& w : packed) w = static_cast<int32_t>(rng());
      std::vector<int32_t> zero_point(static_cast<size_t>(ct::ZeroPointRows(N, 4) * (K / G)));
      for (int32_t& w : zero_point) w = static_cast<int32_t>(rng());
      std::vector<uint16_t> scales(static_cast<size_t>(N * (K / G)));
      for (uint16_t& s : scales) {
        s = static_cast<uint16_t>(rng());
        if ((s & 0x7C00u) == 0x7C00u) s &= 0xBFFFu;  // finite in both dtypes
        if (scale_dtype == DType::kBF16 && (s & 0x7F80u) == 0x7F80u) s &= 0xBF7Fu;
      }
      const int64_t dims[2] = {N, K};
      const QuantView view =
          ct::MakeView(shape, packed.data(), scales.data(), zero_point.data(), nullptr, dims);
      for (const DType out_dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
        std::vector<uint8_t> want(static_cast<size_t>(shape.output_bytes(out_dtype)));
        ASSERT_TRUE(DequantizeReference(view, out_dtype, 0, N, want.data()).ok());
        std::vector<uint8_t> got(want.size(), 0xFF);
        const int values = out_dtype == DType::kF32 ? 4 : 8;
        for (int64_t n = 0; n < N; ++n) {
          for (int64_t k0 = 0; k0 < K; k0 += values) {
            const uint32_t word =
                static_cast<uint32_t>(packed[static_cast<size_t>(n * K / 8 + k0 / 8)]) >>
                (4 * (k0 % 8));
            const int64_t g = k0 / G;
            const uint32_t z = ct::ZeroAt(ct::WeightZeroPoint(view), n, g, K / G, 4);
            const uint32_t s = scales[static_cast<size_t>(ct::ScaleIndex(n, g, K / G, flags))];
            const uint32_t scale_pair = s | s << 16;
            for (int i = 0; i < values / 2; ++i) {
              const uint32_t codes = scale_dtype == DType::kF16
                                         ? np::SeqPairF16LoHi(word, i)
                                         : np::SeqPairBf16(word, word >> 4, i);
              const uint32_t zero_pair = scale_dtype == DType::kF16
                                             ? np::ZeroPair(z, z, np::kF16Lo, np::kF16Hi)
                                             : np::ZeroPair(z, z, np::kBf16Lo, np::kBf16Lo);
              const uint32_t product = PairOp(PairOp(codes, zero_pair, scale_dtype, false),
                                              scale_pair, scale_dtype, true);
              for (int h = 0; h < 2; ++h) {
                Store(got, out_dtype, n * K + k0 + 2 * i + h, Value(Half(product, h), scale_dtype));
              }
            }
          }
        }
        EXPECT_TRUE(got == want) << DTypeName(scale_dtype) << " -> " << DTypeName(out_dtype)
                                 << " flags " << flags;
      }
    }
  }
}

// GPTQ (K, N) 4-bit: GptqKnChunkKernel's KnPairDecode, thread by thread (8 columns, or 4 for fp32
// output), act-order g_idx and v1 zeros.
TEST(NibblePairsTest, GptqKnPairRowsMatchTheReference) {
  constexpr int64_t K = 64, N = 32, G = 16;
  std::mt19937 rng(13);
  for (const DType scale_dtype : {DType::kF16, DType::kBF16}) {
    for (const uint32_t flags : {gptq::kZerosV1, uint32_t{0}}) {
      const QuantShape shape = gptq::MakeShape(K, N, G, 4, flags, scale_dtype, Orientation::kKN);
      std::vector<int32_t> qweight(static_cast<size_t>(K / 8 * N));
      for (int32_t& w : qweight) w = static_cast<int32_t>(rng());
      std::vector<int32_t> qzeros(static_cast<size_t>(K / G * N / 8));
      for (int32_t& w : qzeros) w = static_cast<int32_t>(rng());
      std::vector<uint16_t> scales(static_cast<size_t>(K / G * N));
      for (uint16_t& s : scales) {
        s = static_cast<uint16_t>(rng());
        if ((s & 0x7C00u) == 0x7C00u) s &= 0xBFFFu;
        if (scale_dtype == DType::kBF16 && (s & 0x7F80u) == 0x7F80u) s &= 0xBF7Fu;
      }
      std::vector<int32_t> g_idx(static_cast<size_t>(K));
      for (int64_t k = 0; k < K; ++k) g_idx[static_cast<size_t>(k)] = static_cast<int32_t>(k / G);
      std::shuffle(g_idx.begin(), g_idx.end(), rng);
      const QuantView view =
          gptq::MakeView(shape, qweight.data(), qzeros.data(), scales.data(), g_idx.data());
      for (const DType out_dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
        std::vector<uint8_t> want(static_cast<size_t>(shape.output_bytes(out_dtype)));
        ASSERT_TRUE(DequantizeReference(view, out_dtype, 0, K, want.data()).ok());
        std::vector<uint8_t> got(want.size(), 0xFF);
        const bool native = out_dtype == scale_dtype;
        const DType diff = native ? scale_dtype : DType::kF16;  // KnPairDecode::kDiff
        const int values = out_dtype == DType::kF32 ? 4 : 8;
        for (int64_t kw = 0; kw < K / 8; ++kw) {
          for (int64_t n0 = 0; n0 < N; n0 += values) {
            const uint32_t* q =
                reinterpret_cast<const uint32_t*>(&qweight[static_cast<size_t>(kw * N + n0)]);
            for (int b = 0; b < 4; ++b) {
              std::array<uint32_t, 4> cross{};
              for (int i = 0; i < values / 2; ++i)
                cross[i] = np::CrossBytes(q[2 * i], q[2 * i + 1], b);
              for (int odd = 0; odd < 2; ++odd) {
                const int64_t k = kw * 8 + 2 * b + odd;
                const int64_t g = g_idx[static_cast<size_t>(k)];
                uint32_t zw =
                    static_cast<uint32_t>(qzeros[static_cast<size_t>(g * N / 8 + n0 / 8)]);
                if ((flags & gptq::kZerosV1) != 0) zw += gptq::V1WordBias(4);
                zw >>= 4 * (n0 % 8);
                for (int i = 0; i < values / 2; ++i) {
                  uint32_t qp, zp;
                  if (diff == DType::kF16) {
                    qp = np::CrossPairF16(cross[i], odd != 0);
                    zp = odd ? np::SeqPairF16Hi(zw << 4, zw, i) : np::SeqPairF16Lo(zw, zw >> 4, i);
                  } else {
                    qp = np::CrossPairBf16(cross[i], odd != 0);
                    zp = np::SeqPairBf16(zw, zw >> 4, i);
                  }
                  const uint32_t d = PairOp(qp, zp, diff, false);
                  const size_t s0 = static_cast<size_t>(g * N + n0 + 2 * i);
                  const uint32_t scale_pair = scales[s0] | static_cast<uint32_t>(scales[s0 + 1])
                                                               << 16;
                  if (native) {
                    const uint32_t product = PairOp(d, scale_pair, scale_dtype, true);
                    for (int h = 0; h < 2; ++h)
                      Store(got, out_dtype, k * N + n0 + 2 * i + h,
                            Value(Half(product, h), scale_dtype));
                  } else {
                    for (int h = 0; h < 2; ++h) {
                      const float v =
                          Value(Half(d, h), diff) * Value(Half(scale_pair, h), scale_dtype);
                      Store(got, out_dtype, k * N + n0 + 2 * i + h, v);
                    }
                  }
                }
              }
            }
          }
        }
        EXPECT_TRUE(got == want) << DTypeName(scale_dtype) << " -> " << DTypeName(out_dtype)
                                 << " flags " << flags;
      }
    }
  }
}

}  // namespace
}  // namespace dequantd
