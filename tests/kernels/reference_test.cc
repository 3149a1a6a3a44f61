// DequantizeReference against hand-worked vectors: the nibble order through the whole path, and a
// small layer with zero points and scales whose fp16 results are worked out in the comments.
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/awq_format.h"
#include "kernels/dequant.h"
#include "tests/kernels/test_util.h"

namespace dequantd {
namespace {

using testing::HostLayer;
using testing::ZeroLayer;

constexpr std::array<int, 8> kNibble = {0, 4, 1, 5, 2, 6, 3, 7};

std::vector<uint16_t> RunF16(const HostLayer& layer, int64_t row_begin, int64_t row_end) {
  std::vector<uint16_t> out(static_cast<size_t>((row_end - row_begin) * layer.shape.N), 0xA5A5);
  EXPECT_TRUE(DequantizeReference(layer.view(), DType::kF16, row_begin, row_end, out.data()).ok());
  return out;
}

// Row 16*i + v holds one word with only column i's nibble set to v; zero 0, scale 1: w == q.
TEST(ReferenceTest, NibbleOrderK128N8G128F32) {
  HostLayer layer = ZeroLayer({.K = 128, .N = 8, .group_size = 128, .scale_dtype = DType::kF16});
  for (uint16_t& s : layer.scales) s = 0x3C00;  // 1.0
  for (int i = 0; i < 8; ++i) {
    for (int v = 0; v < 16; ++v) layer.qweight[16 * i + v] = v << (4 * kNibble[i]);
  }
  std::vector<float> out(128 * 8, -1.0f);
  ASSERT_TRUE(DequantizeReference(layer.view(), DType::kF32, 0, 128, out.data()).ok());
  for (int i = 0; i < 8; ++i) {
    for (int v = 0; v < 16; ++v) {
      for (int j = 0; j < 8; ++j) {
        EXPECT_EQ(out[(16 * i + v) * 8 + j], j == i ? static_cast<float>(v) : 0.0f)
            << "column " << i << " value " << v << " read at " << j;
      }
    }
  }
}

TEST(ReferenceTest, NegativeWordsK2N8G2F32) {
  HostLayer layer = ZeroLayer({.K = 2, .N = 8, .group_size = 2, .scale_dtype = DType::kBF16});
  for (uint16_t& s : layer.scales) s = 0x3F80;  // bf16 1.0
  layer.qweight = {static_cast<int32_t>(0xF0000000u), static_cast<int32_t>(0x87654321u)};
  std::vector<float> out(16);
  ASSERT_TRUE(DequantizeReference(layer.view(), DType::kF32, 0, 2, out.data()).ok());
  const std::vector<float> expected = {0, 0, 0, 0, 0, 0, 0, 15,  // 0xF0000000
                                       1, 5, 2, 6, 3, 7, 4, 8};  // 0x87654321
  EXPECT_EQ(out, expected);
}

// K = 2, N = 8, G = 1 (two groups), fp16 scales and output.
TEST(ReferenceTest, WorkedExampleK2N8G1F16) {
  HostLayer layer = ZeroLayer({.K = 2, .N = 8, .group_size = 1, .scale_dtype = DType::kF16});
  // Row 0: q = [1,5,2,6,3,7,4,8] (0x87654321), z = 3 everywhere,
  //   s = [0.5, 1, 2, -1, 0.25, 3, 0x3555 (= 0.333251953125), 65504].
  // Row 1: q = [0,0,0,0,0,0,0,15] (0xF0000000), z = [8,0,0,0,0,0,0,1] (0x10000008),
  //   s = [1, 1, 1, -1, 1, 1, 1, 2^-24 (0x0001)].
  layer.qweight = {static_cast<int32_t>(0x87654321u), static_cast<int32_t>(0xF0000000u)};
  layer.qzeros = {0x33333333, 0x10000008};
  layer.scales = {0x3800, 0x3C00, 0x4000, 0xBC00, 0x3400, 0x4200, 0x3555, 0x7BFF,
                  0x3C00, 0x3C00, 0x3C00, 0xBC00, 0x3C00, 0x3C00, 0x3C00, 0x0001};
  const std::vector<uint16_t> expected = {
      // Row 0: (1-3)*0.5 = -1 -> 0xBC00; (5-3)*1 = 2 -> 0x4000; (2-3)*2 = -2 -> 0xC000;
      // (6-3)*-1 = -3 -> 0xC200; (3-3)*0.25 = +0 -> 0x0000; (7-3)*3 = 12 = 1.5*2^3 -> 0x4A00;
      // (4-3)*s = s -> 0x3555; (8-3)*65504 = 327520 > 65520 -> inf 0x7C00.
      0xBC00, 0x4000, 0xC000, 0xC200, 0x0000, 0x4A00, 0x3555, 0x7C00,
      // Row 1: (0-8)*1 = -8 -> 0xC800; 0*1 = +0 (x2); 0*-1 = -0 -> 0x8000; +0 (x3);
      // (15-1)*2^-24 = 14 * 2^-24, a subnormal -> 0x000E.
      0xC800, 0x0000, 0x0000, 0x8000, 0x0000, 0x0000, 0x0000, 0x000E};
  EXPECT_EQ(RunF16(layer, 0, 2), expected);
  // Row 1 alone: out points at row 1.
  EXPECT_EQ(RunF16(layer, 1, 2), std::vector<uint16_t>(expected.begin() + 8, expected.end()));
}

// The same layer as an (N, K) result: w_nk[n][k] = w_kn[k][n], each element the worked value
// above (row n of the (8, 2) result is column n of the (2, 8) one).
TEST(ReferenceTest, WorkedExampleNkK2N8G1F16) {
  HostLayer layer = ZeroLayer({.K = 2,
                               .N = 8,
                               .group_size = 1,
                               .scale_dtype = DType::kF16,
                               .orientation = Orientation::kNK});
  layer.qweight = {static_cast<int32_t>(0x87654321u), static_cast<int32_t>(0xF0000000u)};
  layer.qzeros = {0x33333333, 0x10000008};
  layer.scales = {0x3800, 0x3C00, 0x4000, 0xBC00, 0x3400, 0x4200, 0x3555, 0x7BFF,
                  0x3C00, 0x3C00, 0x3C00, 0xBC00, 0x3C00, 0x3C00, 0x3C00, 0x0001};
  const std::vector<uint16_t> expected = {
      0xBC00, 0xC800,  // n = 0: k = 0, k = 1
      0x4000, 0x0000,  // n = 1
      0xC000, 0x0000,  // n = 2
      0xC200, 0x8000,  // n = 3
      0x0000, 0x0000,  // n = 4
      0x4A00, 0x0000,  // n = 5
      0x3555, 0x0000,  // n = 6
      0x7C00, 0x000E,  // n = 7
  };
  std::vector<uint16_t> out(16, 0xA5A5);
  ASSERT_TRUE(DequantizeReference(layer.view(), DType::kF16, 0, 8, out.data()).ok());
  EXPECT_EQ(out, expected);
  // Rows [3, 6) of the (8, 2) result: out points at row 3.
  std::vector<uint16_t> part(6, 0xA5A5);
  ASSERT_TRUE(DequantizeReference(layer.view(), DType::kF16, 3, 6, part.data()).ok());
  EXPECT_EQ(part, std::vector<uint16_t>(expected.begin() + 6, expected.begin() + 12));
  // Rows are N's for an (N, K) result: row 9 of 8 is out of range.
  EXPECT_EQ(DequantizeReference(layer.view(), DType::kF16, 0, 9, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// K = 4, G = 2: rows 0-1 use group 0 (z = 0, s = 1), rows 2-3 group 1 (z = 2, s = 0.5); q = 1.
TEST(ReferenceTest, GroupIndexK4N8G2F16) {
  HostLayer layer = ZeroLayer({.K = 4, .N = 8, .group_size = 2, .scale_dtype = DType::kF16});
  for (int32_t& w : layer.qweight) w = 0x11111111;
  layer.qzeros = {0x00000000, 0x22222222};
  for (int n = 0; n < 8; ++n) {
    layer.scales[n] = 0x3C00;      // 1.0
    layer.scales[8 + n] = 0x3800;  // 0.5
  }
  // Rows 0-1: (1-0)*1 = 1 -> 0x3C00. Rows 2-3: (1-2)*0.5 = -0.5 -> 0xB800.
  std::vector<uint16_t> expected(32, 0x3C00);
  std::fill(expected.begin() + 16, expected.end(), 0xB800);
  EXPECT_EQ(RunF16(layer, 0, 4), expected);
  EXPECT_EQ(RunF16(layer, 1, 3),
            std::vector<uint16_t>(expected.begin() + 8, expected.begin() + 24));
}

// bf16 output of the same kind of example: (q - z) * s rounded to bf16.
TEST(ReferenceTest, WorkedExampleK1N8G1Bf16ScalesBf16Out) {
  HostLayer layer = ZeroLayer({.K = 1, .N = 8, .group_size = 1, .scale_dtype = DType::kBF16});
  layer.qweight = {static_cast<int32_t>(0x87654321u)};  // q = [1,5,2,6,3,7,4,8]
  layer.qzeros = {0x11111111};                          // z = 1
  // s = 1.0 (0x3F80) except column 7: 0x3F81 = 1 + 2^-7; (8-1)*(1+2^-7) = 7 + 7/128 =
  // 7.0546875 = 0x40E1C000 in fp32, whose bf16 rounding drops 0xC000 > 0x8000: up -> 0x40E2.
  layer.scales = {0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F81};
  std::vector<uint16_t> out(8);
  ASSERT_TRUE(DequantizeReference(layer.view(), DType::kBF16, 0, 1, out.data()).ok());
  // (q-1) = [0,4,1,5,2,6,3,7]: 0 -> 0x0000, 4 -> 0x4080, 1 -> 0x3F80, 5 -> 0x40A0, 2 -> 0x4000,
  // 6 -> 0x40C0, 3 -> 0x4040.
  const std::vector<uint16_t> expected = {0x0000, 0x4080, 0x3F80, 0x40A0,
                                          0x4000, 0x40C0, 0x4040, 0x40E2};
  EXPECT_EQ(out, expected);
}

TEST(ReferenceTest, RejectsBadCalls) {
  HostLayer layer = ZeroLayer({.K = 4, .N = 8, .group_size = 2, .scale_dtype = DType::kF16});
  std::vector<uint16_t> out(32);
  QuantView v = layer.view();
  EXPECT_EQ(DequantizeReference(v, DType::kF16, 0, 5, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeReference(v, DType::kF16, -1, 2, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeReference(v, DType::kF16, 3, 2, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeReference(v, DType::kF16, 0, 4, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(DequantizeReference(v, DType::kF16, 2, 2, nullptr).ok());  // empty range
  EXPECT_EQ(DequantizeReference(v, DType::kI32, 0, 4, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  for (int which = 0; which < 3; ++which) {
    QuantView bad = v;
    if (which == 0) bad.tensors[awq::kQweight] = nullptr;
    if (which == 1) bad.tensors[awq::kQzeros] = nullptr;
    if (which == 2) bad.tensors[awq::kScales] = nullptr;
    const absl::Status s = DequantizeReference(bad, DType::kF16, 0, 4, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << which;
    EXPECT_NE(s.message().find(which == 0   ? "qweight"
                               : which == 1 ? "qzeros"
                                            : "scales"),
              absl::string_view::npos)
        << s.message();
  }
}

}  // namespace
}  // namespace dequantd
