// The exact scalar conversions of kernels/awq_format.h against independently known values,
// exhaustive round trips, and two independent oracles: the compiler's _Float16 conversion (libgcc's
// __truncsfhf2) and a nearest-candidate search in double precision for bf16.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "kernels/awq_format.h"

namespace dequantd {
namespace {

bool HalfIsNan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0; }
bool Bf16IsNan(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0; }

TEST(HalfConversionTest, KnownValues) {
  EXPECT_EQ(FloatToHalfBitsRne(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalfBitsRne(-1.0f), 0xBC00);
  EXPECT_EQ(FloatToHalfBitsRne(0.5f), 0x3800);
  EXPECT_EQ(FloatToHalfBitsRne(65504.0f), 0x7BFF);    // largest half
  EXPECT_EQ(FloatToHalfBitsRne(65519.996f), 0x7BFF);  // just below the inf threshold
  EXPECT_EQ(FloatToHalfBitsRne(65520.0f), 0x7C00);    // tie between 65504 and 65536 -> inf
  EXPECT_EQ(FloatToHalfBitsRne(-65520.0f), 0xFC00);
  EXPECT_EQ(FloatToHalfBitsRne(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToHalfBitsRne(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalfBitsRne(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even 0
  EXPECT_EQ(FloatToHalfBitsRne(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(FloatToHalfBitsRne(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalfBitsRne(std::ldexp(3.0f, -26)), 0x0001);     // 0.75 units -> 1
  EXPECT_EQ(FloatToHalfBitsRne(std::ldexp(3.0f, -25)), 0x0002);     // 1.5 units: tie -> even 2
  EXPECT_EQ(FloatToHalfBitsRne(std::ldexp(5.0f, -25)), 0x0002);     // 2.5 units: tie -> even 2
  EXPECT_EQ(FloatToHalfBitsRne(std::ldexp(2047.0f, -25)), 0x0400);  // 1023.5 units -> 1024
  EXPECT_EQ(FloatToHalfBitsRne(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(FloatToHalfBitsRne(1e-45f), 0x0000);  // float subnormal
  // Ties to even among normals: 1 + 2^-11 lies halfway between 0x3C00 and 0x3C01.
  EXPECT_EQ(FloatToHalfBitsRne(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(FloatToHalfBitsRne(1.0f + std::ldexp(3.0f, -11)), 0x3C02);
  EXPECT_EQ(FloatToHalfBitsRne(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_EQ(FloatToHalfBitsRne(2047.0f + 0.5f), 0x6800);  // 2047.5 -> 2048 (exponent carry)
  EXPECT_EQ(FloatToHalfBitsRne(2049.0f), 0x6800);         // tie between 2048 and 2050 -> 2048
  EXPECT_EQ(FloatToHalfBitsRne(2051.0f), 0x6802);         // tie between 2050 and 2052 -> 2052
  EXPECT_EQ(FloatToHalfBitsRne(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalfBitsRne(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalfBitsRne(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToHalfBitsRne(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(FloatToHalfBitsRne(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_TRUE(HalfIsNan(FloatToHalfBitsRne(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(HalfIsNan(FloatToHalfBitsRne(BitsToFloat(0x7F800001u))));  // signaling, tiny payload
  EXPECT_TRUE(HalfIsNan(FloatToHalfBitsRne(BitsToFloat(0xFFC00000u))));
}

TEST(HalfConversionTest, HalfBitsToFloatKnownValues) {
  EXPECT_EQ(HalfBitsToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfBitsToFloat(0xC000), -2.0f);
  EXPECT_EQ(HalfBitsToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfBitsToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfBitsToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfBitsToFloat(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(HalfBitsToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(FloatBits(HalfBitsToFloat(0x8000)), 0x80000000u);  // -0
  EXPECT_EQ(FloatBits(HalfBitsToFloat(0x8001)), FloatBits(-std::ldexp(1.0f, -24)));
  EXPECT_EQ(HalfBitsToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfBitsToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0x7E00)));
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0x7C01)));
}

TEST(HalfConversionTest, ExhaustiveRoundTrip) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f = HalfBitsToFloat(bits);
    if (HalfIsNan(bits)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_TRUE(HalfIsNan(FloatToHalfBitsRne(f))) << std::hex << h;
    } else {
      ASSERT_EQ(FloatToHalfBitsRne(f), bits) << std::hex << h;
    }
  }
}

uint16_t CompilerHalfBits(float f) {
  const auto h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

// Random floats: full 32-bit patterns, and patterns concentrated in and around half's range
// (exponents 2^-27 .. 2^17) where rounding decisions happen.
TEST(HalfConversionTest, MatchesCompilerFloat16OnRandomFloats) {
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<uint32_t> exp_dist(127 - 27, 127 + 17);
  int mismatches = 0;
  for (int i = 0; i < 4'000'000; ++i) {
    uint32_t u = rng();
    if (i % 2 == 1) u = (u & 0x807FFFFFu) | (exp_dist(rng) << 23);
    if (i % 4 == 3) u &= 0xFFFFF000u | (rng() & 0x1000u);  // many exact ties
    const float f = BitsToFloat(u);
    const uint16_t ours = FloatToHalfBitsRne(f);
    const uint16_t oracle = CompilerHalfBits(f);
    const bool same = std::isnan(f) ? HalfIsNan(ours) && HalfIsNan(oracle) : ours == oracle;
    if (!same && ++mismatches <= 10) {
      ADD_FAILURE() << std::hex << "float bits 0x" << u << ": ours 0x" << ours << ", _Float16 0x"
                    << oracle;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Bf16ConversionTest, KnownValues) {
  EXPECT_EQ(FloatToBf16BitsRne(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16BitsRne(-2.0f), 0xC000);
  EXPECT_EQ(FloatToBf16BitsRne(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie -> even
  EXPECT_EQ(FloatToBf16BitsRne(1.0f + std::ldexp(3.0f, -8)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(FloatToBf16BitsRne(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(FloatToBf16BitsRne(BitsToFloat(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(FloatToBf16BitsRne(BitsToFloat(0x7F7F8000u)), 0x7F80);  // tie, odd -> up to inf
  EXPECT_EQ(FloatToBf16BitsRne(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(FloatToBf16BitsRne(BitsToFloat(0x00018000u)), 0x0002);  // subnormal tie, odd -> up
  EXPECT_EQ(FloatToBf16BitsRne(BitsToFloat(0x00008000u)), 0x0000);  // subnormal tie, even
  EXPECT_EQ(FloatToBf16BitsRne(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16BitsRne(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBf16BitsRne(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_TRUE(Bf16IsNan(FloatToBf16BitsRne(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(Bf16IsNan(FloatToBf16BitsRne(BitsToFloat(0x7F800001u))));  // payload only low
  EXPECT_TRUE(Bf16IsNan(FloatToBf16BitsRne(BitsToFloat(0xFF800001u))));
  EXPECT_EQ(Bf16BitsToFloat(0x3F80), 1.0f);
  EXPECT_EQ(Bf16BitsToFloat(0xC040), -3.0f);
  EXPECT_EQ(Bf16BitsToFloat(0x0001), std::ldexp(1.0f, -133));
  EXPECT_EQ(Bf16BitsToFloat(0x7F80), std::numeric_limits<float>::infinity());
}

TEST(Bf16ConversionTest, ExhaustiveRoundTrip) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float f = Bf16BitsToFloat(bits);
    if (Bf16IsNan(bits)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << b;
      EXPECT_TRUE(Bf16IsNan(FloatToBf16BitsRne(f))) << std::hex << b;
    } else {
      ASSERT_EQ(FloatToBf16BitsRne(f), bits) << std::hex << b;
    }
  }
}

// Oracle: of the two bf16 values bracketing |f| (truncation and the next one up), the nearer in
// exact double arithmetic, the even one on a tie.
uint16_t NearestBf16(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t down = (u & 0x7FFF0000u);
  const uint32_t up = down + 0x10000u;  // may be 0x7F800000 (inf): treat as 2^128
  const double a = std::fabs(static_cast<double>(f));
  const double lo = static_cast<double>(BitsToFloat(down));
  const double hi = up == 0x7F800000u ? std::ldexp(1.0, 128) : static_cast<double>(BitsToFloat(up));
  uint32_t pick;
  if (a - lo < hi - a) {
    pick = down;
  } else if (a - lo > hi - a) {
    pick = up;
  } else {
    pick = ((down >> 16) & 1u) ? up : down;
  }
  return static_cast<uint16_t>((sign | pick) >> 16);
}

TEST(Bf16ConversionTest, MatchesNearestCandidateOnRandomFloats) {
  std::mt19937 rng(7);
  for (int i = 0; i < 1'000'000; ++i) {
    uint32_t u = rng();
    if (i % 3 == 0) u &= 0xFFFF8000u | (rng() & 0x8000u);  // many exact ties
    if ((u & 0x7F800000u) == 0x7F800000u) continue;        // finite only here
    ASSERT_EQ(FloatToBf16BitsRne(BitsToFloat(u)), NearestBf16(BitsToFloat(u)))
        << std::hex << "0x" << u;
  }
}

}  // namespace
}  // namespace dequantd
