// kernels/mxfp4_pairs.h on the host (no GPU): the E2M1 byte tables against the format's magnitudes,
// E2m1CrossPairs for every pair of bytes in every byte position (both output dtypes), the scale
// bits against mxfp4::ScaleToFloat over each dtype's exact range, and Mxfp4KnColumnKernel's
// composition, mirrored here with the packed multiply emulated, against the CPU reference
// (experts, an odd number of blocks, scales in and out of the packed range). The GPU run
// (tests/cuda/mxfp4_cuda_test.cc) checks the kernel itself.
#include "kernels/mxfp4_pairs.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/dequant.h"
#include "kernels/dtype.h"
#include "kernels/mxfp4_format.h"

namespace dequantd {
namespace {

namespace mp = mxfp4_pairs;

uint16_t Half(uint32_t pair, int h) { return static_cast<uint16_t>(pair >> (16 * h)); }
float Value(uint16_t bits, DType dtype) {
  return dtype == DType::kBF16 ? Bf16BitsToFloat(bits) : HalfBitsToFloat(bits);
}
uint16_t RoundTo(float v, DType dtype) {
  return dtype == DType::kBF16 ? FloatToBf16BitsRne(v) : FloatToHalfBitsRne(v);
}
uint32_t TableByte(uint32_t lo_word, uint32_t hi_word, uint32_t m) {
  return ((m < 4 ? lo_word : hi_word) >> (8 * (m % 4))) & 0xFFu;
}

TEST(Mxfp4PairsTest, TablesHoldTheE2m1Magnitudes) {
  for (uint32_t m = 0; m < 8; ++m) {
    const float magnitude = mxfp4::kFp4Magnitudes[m];
    EXPECT_EQ(
        TableByte(mp::kBf16Hi0, mp::kBf16Hi1, m) << 8 | TableByte(mp::kBf16Lo0, mp::kBf16Lo1, m),
        FloatToBf16BitsRne(magnitude))
        << m;
    EXPECT_EQ(TableByte(mp::kF16Hi0, mp::kF16Hi1, m) << 8, FloatToHalfBitsRne(magnitude)) << m;
  }
}

TEST(Mxfp4PairsTest, CrossPairsAreTheE2m1ValuesOfBothRowsForAllBytePairs) {
  std::mt19937 rng(5);
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    for (int b = 0; b < 4; ++b) {
      for (uint32_t v = 0; v < 65536; ++v) {
        const uint32_t mask = 0xFFu << (8 * b);
        const uint32_t x = (static_cast<uint32_t>(rng()) & ~mask) | (v & 0xFFu) << (8 * b);
        const uint32_t y = (static_cast<uint32_t>(rng()) & ~mask) | (v >> 8) << (8 * b);
        uint32_t even;
        uint32_t odd;
        if (dtype == DType::kF16) {
          mp::E2m1CrossPairs<DType::kF16>(x, y, b, even, odd);
        } else {
          mp::E2m1CrossPairs<DType::kBF16>(x, y, b, even, odd);
        }
        const uint32_t xb = (x >> (8 * b)) & 0xFFu, yb = (y >> (8 * b)) & 0xFFu;
        // Bits, not values: -0 must stay -0.
        ASSERT_EQ(Half(even, 0), RoundTo(mxfp4::Fp4ToFloat(xb & 0xFu), dtype)) << x << " " << b;
        ASSERT_EQ(Half(even, 1), RoundTo(mxfp4::Fp4ToFloat(yb & 0xFu), dtype)) << y << " " << b;
        ASSERT_EQ(Half(odd, 0), RoundTo(mxfp4::Fp4ToFloat(xb >> 4), dtype)) << x << " " << b;
        ASSERT_EQ(Half(odd, 1), RoundTo(mxfp4::Fp4ToFloat(yb >> 4), dtype)) << y << " " << b;
      }
    }
  }
}

// ScaleBits is 2^(s - 127) exactly over each dtype's range, and the range is exactly the scales
// whose power of two the dtype holds (so the packed multiply's operands are the definition's).
TEST(Mxfp4PairsTest, ScaleBitsArePowersOfTwoOverTheExactRange) {
  for (uint32_t s = 0; s < 256; ++s) {
    const float scale = mxfp4::ScaleToFloat(static_cast<uint8_t>(s));
    const bool bf16 = mp::ScaleIsExactIn<DType::kBF16>(s);
    const bool f16 = mp::ScaleIsExactIn<DType::kF16>(s);
    EXPECT_EQ(bf16, s != mxfp4::kScaleNan) << s;
    EXPECT_EQ(f16,
              s != mxfp4::kScaleNan && Value(RoundTo(scale, DType::kF16), DType::kF16) == scale)
        << s;  // 0xFF (inf) is held but is the format's NaN case
    if (bf16) {
      EXPECT_EQ(Value(static_cast<uint16_t>(mp::ScaleBits<DType::kBF16>(s)), DType::kBF16), scale)
          << s;
    }
    if (f16) {
      EXPECT_EQ(Value(static_cast<uint16_t>(mp::ScaleBits<DType::kF16>(s)), DType::kF16), scale)
          << s;
    }
  }
}

// Mxfp4KnColumnKernel, thread by thread: (expert, block g, 8 block rows), 32 result rows each.
TEST(Mxfp4PairsTest, KnColumnThreadsMatchTheReference) {
  constexpr int64_t E = 2, K = 96, N = 16;  // 3 blocks per row: the last pair has one
  std::mt19937 rng(17);
  const QuantShape shape = mxfp4::MakeShape(K, N, E);
  std::vector<uint8_t> blocks(static_cast<size_t>(E * N * K / 2));
  for (uint8_t& byte : blocks) byte = static_cast<uint8_t>(rng());
  std::vector<uint8_t> scales(static_cast<size_t>(E * N * K / 32));
  for (size_t i = 0; i < scales.size(); ++i) {
    // Mostly scales near 1, some anywhere (0, 0xFF, beyond fp16's range) to take the exact path.
    scales[i] = static_cast<uint8_t>(i % 5 == 0 ? rng() : 110 + rng() % 30);
  }
  const QuantView view = mxfp4::MakeView(shape, blocks.data(), scales.data());
  for (const DType out : {DType::kF16, DType::kBF16}) {
    std::vector<uint8_t> want(static_cast<size_t>(shape.output_bytes(out)));
    ASSERT_TRUE(DequantizeReference(view, out, 0, shape.result_rows(), want.data()).ok());
    std::vector<uint16_t> got(want.size() / 2, 0xFFFF);
    const int64_t groups = K / 32;
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t n0 = 0; n0 < N; n0 += 8) {
          const int64_t row0 = e * N + n0;
          uint32_t words[8][4];
          uint32_t s[8];
          bool packed = true;
          for (int r = 0; r < 8; ++r) {
            std::memcpy(words[r], &blocks[static_cast<size_t>(((row0 + r) * groups + g) * 16)], 16);
            s[r] = scales[static_cast<size_t>((row0 + r) * groups + g)];
            packed &= out == DType::kBF16 ? mp::ScaleIsExactIn<DType::kBF16>(s[r])
                                          : mp::ScaleIsExactIn<DType::kF16>(s[r]);
          }
          const auto at = [&](int k, int r) -> uint16_t& {
            return got[static_cast<size_t>((e * K + g * 32 + k) * N + n0 + r)];
          };
          if (!packed) {  // the exact per-value path
            for (int k = 0; k < 32; ++k) {
              for (int r = 0; r < 8; ++r) {
                const auto byte = static_cast<uint8_t>(words[r][k / 8] >> (8 * ((k / 2) % 4)));
                at(k, r) = RoundTo(
                    mxfp4::Element(mxfp4::NibbleOf(byte, k), static_cast<uint8_t>(s[r])), out);
              }
            }
            continue;
          }
          for (int w = 0; w < 4; ++w) {
            for (int b = 0; b < 4; ++b) {
              for (int i = 0; i < 4; ++i) {
                uint32_t even;
                uint32_t odd;
                uint32_t scale_pair;
                if (out == DType::kF16) {
                  mp::E2m1CrossPairs<DType::kF16>(words[2 * i][w], words[2 * i + 1][w], b, even,
                                                  odd);
                  scale_pair = mp::ScaleBits<DType::kF16>(s[2 * i]) |
                               mp::ScaleBits<DType::kF16>(s[2 * i + 1]) << 16;
                } else {
                  mp::E2m1CrossPairs<DType::kBF16>(words[2 * i][w], words[2 * i + 1][w], b, even,
                                                   odd);
                  scale_pair = mp::ScaleBits<DType::kBF16>(s[2 * i]) |
                               mp::ScaleBits<DType::kBF16>(s[2 * i + 1]) << 16;
                }
                const int k = 8 * w + 2 * b;
                for (int h = 0; h < 2; ++h) {  // MulPairs: the product rounded once
                  const float scale = Value(Half(scale_pair, h), out);
                  at(k, 2 * i + h) = RoundTo(Value(Half(even, h), out) * scale, out);
                  at(k + 1, 2 * i + h) = RoundTo(Value(Half(odd, h), out) * scale, out);
                }
              }
            }
          }
        }
      }
    }
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0) << DTypeName(out);
  }
}

}  // namespace
}  // namespace dequantd
