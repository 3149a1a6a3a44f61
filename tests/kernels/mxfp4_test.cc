// MXFP4, hand-worked (mxfp4_format.h): the E2M1 values, the E8M0 scales (0, 127, 254, 0xFF),
// the nibble order, the expert axis and both orientations, fp16's overflow and underflow, the CPU
// path against the reference, the shape from stored tensors and the shape checks.
// tests/server/mxfp4_vectors_test.cc pins the same rules to transformers' own results; these
// values are worked out by hand.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu_dequant_internal.h"
#include "kernels/dequant.h"
#include "kernels/format_registry.h"
#include "kernels/mxfp4_format.h"

namespace dequantd {
namespace {

using ::testing::HasSubstr;

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// transformers' FP4_VALUES, by nibble.
constexpr float kFp4Values[16] = {+0.0f, 0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

TEST(Mxfp4FormatTest, Fp4ValuesAreTransformersTable) {
  for (uint32_t q = 0; q < 16; ++q) {
    EXPECT_EQ(BitsOf(mxfp4::Fp4ToFloat(q)), BitsOf(kFp4Values[q])) << "nibble " << q;
  }
}

TEST(Mxfp4FormatTest, E8m0ScalesArePowersOfTwoWithInfAt255) {
  EXPECT_EQ(mxfp4::ScaleToFloat(127), 1.0f);
  EXPECT_EQ(mxfp4::ScaleToFloat(128), 2.0f);
  EXPECT_EQ(mxfp4::ScaleToFloat(110), std::ldexp(1.0f, -17));
  EXPECT_EQ(mxfp4::ScaleToFloat(254), std::ldexp(1.0f, 127));
  EXPECT_EQ(mxfp4::ScaleToFloat(1), std::ldexp(1.0f, -126));  // the smallest normal
  EXPECT_EQ(mxfp4::ScaleToFloat(0), std::ldexp(1.0f, -127));  // a subnormal, exact
  EXPECT_EQ(BitsOf(mxfp4::ScaleToFloat(0)), 0x00400000u);
  EXPECT_TRUE(std::isinf(mxfp4::ScaleToFloat(255)));
  // Scale 0xFF: +-inf for nonzero values, the quiet NaN 0x7FC00000 for +-0.
  EXPECT_EQ(mxfp4::Element(0x1, 0xFF), std::numeric_limits<float>::infinity());
  EXPECT_EQ(mxfp4::Element(0x9, 0xFF), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(BitsOf(mxfp4::Element(0x0, 0xFF)), 0x7FC00000u);
  EXPECT_EQ(BitsOf(mxfp4::Element(0x8, 0xFF)), 0x7FC00000u);
  // The smallest product, 0.5 * 2^-127 = 2^-128, is exact (subnormal); 6 * 2^127 overflows.
  EXPECT_EQ(mxfp4::Element(0x1, 0), std::ldexp(1.0f, -128));
  EXPECT_TRUE(std::isinf(mxfp4::Element(0x7, 254)));
}

// One expert, K = 32, N = 2. Row n = 0, scale 128 (x2): byte 0 = 0x21 -> k0 = nibble 1 (0.5),
// k1 = nibble 2 (1); byte 1 = 0xF7 -> k2 = nibble 7 (6), k3 = nibble 0xF (-6). Row n = 1, scale
// 126 (x0.5): byte 0 = 0x9A -> k0 = nibble 0xA (-1), k1 = nibble 9 (-0.5). Every other byte 0.
struct HandLayer {
  std::vector<uint8_t> blocks = std::vector<uint8_t>(2 * 16, 0);
  std::vector<uint8_t> scales = {128, 126};
  HandLayer() {
    blocks[0] = 0x21;
    blocks[1] = 0xF7;
    blocks[16] = 0x9A;
  }
};

TEST(Mxfp4ReferenceTest, LowNibbleFirstKnIsTransformersInOut) {
  HandLayer l;
  const QuantView v = mxfp4::MakeView(mxfp4::MakeShape(32, 2), l.blocks.data(), l.scales.data());
  std::vector<float> out(64, 99.0f);
  ASSERT_TRUE(DequantizeReference(v, DType::kF32, 0, 32, out.data()).ok());
  // (K, N): out[k * 2 + n].
  EXPECT_EQ(out[0 * 2 + 0], 1.0f);
  EXPECT_EQ(out[1 * 2 + 0], 2.0f);
  EXPECT_EQ(out[2 * 2 + 0], 12.0f);
  EXPECT_EQ(out[3 * 2 + 0], -12.0f);
  EXPECT_EQ(out[0 * 2 + 1], -0.5f);
  EXPECT_EQ(out[1 * 2 + 1], -0.25f);
  for (int k = 4; k < 32; ++k) EXPECT_EQ(BitsOf(out[k * 2]), 0u) << k;  // +0
  // (N, K): out[n * 32 + k].
  QuantView nk = v;
  nk.shape.orientation = Orientation::kNK;
  ASSERT_TRUE(DequantizeReference(nk, DType::kF32, 0, 2, out.data()).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[3], -12.0f);
  EXPECT_EQ(out[32 + 0], -0.5f);
  EXPECT_EQ(out[32 + 1], -0.25f);
}

// Two experts: expert 1 is expert 0's bytes with scales 127 (x1). The result stacks (K, N) per
// expert: expert 1 starts at element K * N; a row range may start inside expert 1.
TEST(Mxfp4ReferenceTest, ExpertsStackPerExpertMatrices) {
  HandLayer l;
  std::vector<uint8_t> blocks = l.blocks;
  blocks.insert(blocks.end(), l.blocks.begin(), l.blocks.end());
  std::vector<uint8_t> scales = {128, 126, 127, 127};
  const QuantShape shape = mxfp4::MakeShape(32, 2, /*experts=*/2);
  EXPECT_EQ(shape.result_rows(), 64);
  EXPECT_EQ(shape.output_elements(), 128);
  EXPECT_EQ(shape.packed_bytes(), 64 + 4);
  const QuantView v = mxfp4::MakeView(shape, blocks.data(), scales.data());
  std::vector<float> out(128);
  ASSERT_TRUE(DequantizeReference(v, DType::kF32, 0, 64, out.data()).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[64 + 0], 0.5f);      // expert 1, k 0, n 0
  EXPECT_EQ(out[64 + 2 * 2], 6.0f);  // expert 1, k 2, n 0
  EXPECT_EQ(out[64 + 1], -1.0f);     // expert 1, k 0, n 1
  std::vector<float> part(2 * 2);
  ASSERT_TRUE(DequantizeReference(v, DType::kF32, 33, 35, part.data()).ok());  // expert 1, k 1..2
  EXPECT_EQ(part[0], 1.0f);
  EXPECT_EQ(part[1], -0.5f);
  EXPECT_EQ(part[2], 6.0f);
  EXPECT_THAT(std::string(DequantizeReference(v, DType::kF32, 0, 65, out.data()).message()),
              HasSubstr("E * K = 64"));
}

// fp16 rounds once: 1 * 2^16 = 65536 > 65504 -> inf (0x7C00); 0.5 * 2^16 = 32768 (0x7800);
// 6 * 2^-127 underflows to +0; bf16 keeps 1.5 * 2^-125 exactly (0x0140).
TEST(Mxfp4ReferenceTest, Fp16OverflowAndUnderflowBf16Exact) {
  std::vector<uint8_t> blocks(16, 0);
  blocks[0] = 0x12;  // k0 = 1, k1 = 0.5
  blocks[1] = 0x07;  // k2 = 6
  std::vector<uint8_t> scales = {143};
  const QuantShape shape = mxfp4::MakeShape(32, 1, 1, Orientation::kNK);
  const QuantView v = mxfp4::MakeView(shape, blocks.data(), scales.data());
  std::vector<uint16_t> out(32);
  ASSERT_TRUE(DequantizeReference(v, DType::kF16, 0, 1, out.data()).ok());
  EXPECT_EQ(out[0], 0x7C00);
  EXPECT_EQ(out[1], 0x7800);
  scales[0] = 0;
  ASSERT_TRUE(DequantizeReference(v, DType::kF16, 0, 1, out.data()).ok());
  EXPECT_EQ(out[2], 0x0000);
  ASSERT_TRUE(DequantizeReference(v, DType::kBF16, 0, 1, out.data()).ok());
  EXPECT_EQ(out[2], 0x0140);
  scales[0] = 0xFF;  // +-0 -> NaN (fp16 0x7E00, bf16 0x7FC0), nonzero -> inf
  ASSERT_TRUE(DequantizeReference(v, DType::kF16, 0, 1, out.data()).ok());
  EXPECT_EQ(out[0], 0x7C00);
  EXPECT_EQ(out[3], 0x7E00);
  ASSERT_TRUE(DequantizeReference(v, DType::kBF16, 0, 1, out.data()).ok());
  EXPECT_EQ(out[3], 0x7FC0);
}

// The CPU path equals the reference byte for byte (NaN bits included): random bytes and every
// scale, 3 experts, N = 70 (a partial 64-column tile), both orientations, every output dtype,
// row ranges starting and ending inside blocks and experts, 1 and 3 threads.
TEST(Mxfp4CpuTest, MatchesReferenceBitForBit) {
  const int64_t E = 3, K = 96, N = 70;
  std::mt19937 rng(21);
  std::vector<uint8_t> blocks(static_cast<size_t>(E * N * K / 2));
  std::vector<uint8_t> scales(static_cast<size_t>(E * N * K / 32));
  for (uint8_t& b : blocks) b = static_cast<uint8_t>(rng());
  for (uint8_t& s : scales) s = static_cast<uint8_t>(rng());
  for (Orientation o : {Orientation::kKN, Orientation::kNK}) {
    const QuantShape shape = mxfp4::MakeShape(K, N, E, o);
    const QuantView v = mxfp4::MakeView(shape, blocks.data(), scales.data());
    for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
      const int64_t rows = shape.result_rows();
      const int64_t row_bytes = shape.result_cols() * DTypeSize(dt);
      std::vector<uint8_t> want(static_cast<size_t>(rows * row_bytes));
      ASSERT_TRUE(DequantizeReference(v, dt, 0, rows, want.data()).ok());
      for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, rows}, {5, rows - 7}, {95, 97}}) {
        for (int threads : {1, 3}) {
          std::vector<uint8_t> got(static_cast<size_t>((end - begin) * row_bytes), 0xAB);
          cpu::CpuDequantOptions options{.threads = threads, .min_elements_per_thread = 1};
          ASSERT_TRUE(cpu::DequantizeCpuWithOptions(v, dt, begin, end, got.data(), options).ok());
          EXPECT_EQ(0, std::memcmp(got.data(), want.data() + begin * row_bytes, got.size()))
              << OrientationName(o) << " " << DTypeName(dt) << " rows [" << begin << ", " << end
              << ") threads " << threads;
        }
      }
    }
  }
}

TEST(Mxfp4ShapeTest, FromStoredTensors) {
  const FormatRow& row = FormatRowOf(Format::kMxfp4);
  const int64_t blocks4[] = {2, 64, 2, 16};
  const int64_t scales3[] = {2, 64, 2};
  std::vector<StoredTensor> t = {{"U8", blocks4}, {"U8", scales3}};
  QuantShape shape;
  StoredTensorProblem problem;
  ASSERT_TRUE(row.shape_from_stored(t, {}, &shape, &problem)) << problem.what;
  EXPECT_EQ(shape, mxfp4::MakeShape(64, 64, 2));
  EXPECT_EQ(TensorSpecOf(shape, mxfp4::kBlocks).rows, 128);
  EXPECT_EQ(TensorSpecOf(shape, mxfp4::kBlocks).cols, 32);
  EXPECT_EQ(TensorSpecOf(shape, mxfp4::kScales).cols, 2);
  // No expert axis: one expert.
  const int64_t blocks3[] = {64, 2, 16};
  const int64_t scales2[] = {64, 2};
  std::vector<StoredTensor> flat = {{"U8", blocks3}, {"U8", scales2}};
  ASSERT_TRUE(row.shape_from_stored(flat, {}, &shape, &problem)) << problem.what;
  EXPECT_EQ(shape, mxfp4::MakeShape(64, 64, 1));

  const auto problem_of = [&](StoredTensor blocks, StoredTensor scales) {
    std::vector<StoredTensor> two = {blocks, scales};
    StoredTensorProblem p;
    EXPECT_FALSE(row.shape_from_stored(two, {}, &shape, &p));
    return p;
  };
  StoredTensorProblem p = problem_of({"F8_E4M3", blocks4}, {"U8", scales3});
  EXPECT_EQ(p.role, mxfp4::kBlocks);
  EXPECT_EQ(p.field, "dtype");
  EXPECT_EQ(p.what, "is F8_E4M3, want U8");
  const int64_t blocks8[] = {2, 64, 2, 8};
  p = problem_of({"U8", blocks8}, {"U8", scales3});
  EXPECT_THAT(p.what, HasSubstr("want a last dim of 16 bytes"));
  const int64_t scales_bad[] = {2, 64, 3};
  p = problem_of({"U8", blocks4}, {"U8", scales_bad});
  EXPECT_EQ(p.role, mxfp4::kScales);
  EXPECT_EQ(p.what, "is (2, 64, 3), want (E, N, K/32) = (2, 64, 2) for blocks (2, 64, 2, 16)");
  p = problem_of({"U8", scales_bad}, {"U8", blocks4});
  EXPECT_THAT(p.what, HasSubstr("want a last dim of 16"));
  const int64_t two_dims[] = {64, 32};
  p = problem_of({"U8", two_dims}, {"U8", scales3});
  EXPECT_EQ(p.what, "has 2 dims, want 4 (E, N, K/32, 16) or 3 (N, K/32, 16)");
}

TEST(Mxfp4ShapeTest, ValidateShapeNamesTheField) {
  EXPECT_TRUE(ValidateShape(mxfp4::MakeShape(64, 8, 4), DType::kBF16).ok());
  QuantShape s = mxfp4::MakeShape(48, 8);
  EXPECT_THAT(std::string(ValidateShape(s, DType::kF16).message()),
              HasSubstr("K must be a multiple of 32"));
  s = mxfp4::MakeShape(64, 8);
  s.group_size = 64;
  EXPECT_THAT(std::string(ValidateShape(s, DType::kF16).message()), HasSubstr("group_size"));
  s = mxfp4::MakeShape(64, 8);
  s.scale_dtype = DType::kF16;
  EXPECT_EQ(ValidateShape(s, DType::kF16).message(),
            "scales dtype must be uint8 (E8M0) for mxfp4, got fp16");
  s = mxfp4::MakeShape(64, 8, 0);
  EXPECT_THAT(std::string(ValidateShape(s, DType::kF16).message()), HasSubstr("experts must be"));
  s = mxfp4::MakeShape(int64_t{1} << 20, int64_t{1} << 10, int64_t{1} << 11);  // 2^41 elements
  EXPECT_THAT(std::string(ValidateShape(s, DType::kF16).message()), HasSubstr("experts must be"));
  // Formats without an expert axis refuse experts != 1.
  QuantShape awq = mxfp4::MakeShape(64, 8, 2);
  awq.format = Format::kFp8Block;
  awq.scale_dtype = DType::kF32;
  awq.group_size = 128;
  awq.bits = 8;
  awq.orientation = Orientation::kNK;
  EXPECT_EQ(ValidateShape(awq, DType::kF16).message(), "experts must be 1 for fp8_block, got 2");
}

}  // namespace
}  // namespace dequantd
