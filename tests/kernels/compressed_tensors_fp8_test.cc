// compressed-tensors float-quantized FP8, hand-worked (compressed_tensors_fp8_format.h): E4M3
// bytes times their scale, the scale grid of every strategy (tensor, channel, group, block with
// partial edge blocks), the two roundings (scale dtype, then output dtype), both orientations,
// the CPU path against the reference, the shape from stored tensors with and without a config,
// and the shape checks. tests/server/compressed_tensors_fp8_vectors_test.cc pins the same rules to
// the library's own vectors; these values are worked out by hand.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/compressed_tensors_fp8_format.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/dequant.h"
#include "kernels/format_registry.h"

namespace dequantd {
namespace {

namespace ctf = compressed_tensors_fp8;
using ::testing::HasSubstr;

// E4M3 bytes (bias 7, 3 mantissa bits): 0x38 = 1, 0x3C = 1.5, 0x40 = 2, 0x44 = 3, 0x7E = 448,
// 0x01 = 2^-9 (the smallest subnormal), 0x80 = -0, 0xB8 = -1.
constexpr uint8_t kWeight2x4[8] = {0x40, 0x3C, 0x44, 0x80, 0x38, 0xB8, 0x7E, 0x01};

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Channel strategy, bf16 scales 1.0078125 (0x3F81) and 2 (0x4000), N = 2, K = 4. Row 0:
// 2 * 1.0078125 = 2.015625 (a bf16); 1.5 * 1.0078125 = 1.51171875 = 1.1000001|1b, a tie at bf16's
// 7 fraction bits, rounded to even: 1.515625; 3 * 1.0078125 = 3.0234375 -> 3.03125; -0 * s = -0.
// Row 1 (scale 2): 2, -2, 896, 2^-8. The fp32 result holds the bf16-rounded values (round_sdt).
TEST(CompressedTensorsFp8Test, ChannelBf16ScalesRoundToBf16FirstThenToTheOutput) {
  const uint16_t scale[2] = {0x3F81, 0x4000};
  const QuantShape shape = ctf::MakeShape(4, 2, 1, 4, DType::kBF16);
  ASSERT_TRUE(ValidateShape(shape, DType::kF32).ok());
  EXPECT_EQ(TensorSpecOf(shape, ctf::kWeightScale).rows, 2);
  EXPECT_EQ(TensorSpecOf(shape, ctf::kWeightScale).cols, 1);
  EXPECT_EQ(TensorSpecOf(shape, ctf::kWeight).dtype, DType::kF8E4M3);
  EXPECT_EQ(shape.packed_bytes(), 8 + 4);
  const QuantView view = ctf::MakeView(shape, kWeight2x4, scale);
  const std::vector<float> want = {2.015625f, 1.515625f, 3.03125f, -0.0f,
                                   2.0f,      -2.0f,     896.0f,   0.00390625f};
  std::vector<float> nk(8, 7.0f);
  ASSERT_TRUE(DequantizeReference(view, DType::kF32, 0, 2, nk.data()).ok());
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(BitsOf(nk[i]), BitsOf(want[i])) << i;  // -0 counts
  std::vector<float> cpu(8, 7.0f);
  ASSERT_TRUE(DequantizeCpu(view, DType::kF32, 0, 2, cpu.data(), 2).ok());
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(BitsOf(cpu[i]), BitsOf(want[i])) << i;
  // fp16 output of the same bf16 values: 1.515625 = 0x3E10, 896 = 0x6300, 2^-8 = 0x1C00, -0.
  std::vector<uint16_t> f16(8);
  ASSERT_TRUE(DequantizeReference(view, DType::kF16, 0, 2, f16.data()).ok());
  EXPECT_EQ(f16[1], 0x3E10);
  EXPECT_EQ(f16[3], 0x8000);
  EXPECT_EQ(f16[6], 0x6300);
  EXPECT_EQ(f16[7], 0x1C00);
  // (K, N): w_kn[k][n] = w_nk[n][k].
  QuantView kn = view;
  kn.shape.orientation = Orientation::kKN;
  std::vector<float> got_kn(8);
  ASSERT_TRUE(DequantizeReference(kn, DType::kF32, 0, 4, got_kn.data()).ok());
  for (int k = 0; k < 4; ++k)
    for (int n = 0; n < 2; ++n) EXPECT_EQ(BitsOf(got_kn[k * 2 + n]), BitsOf(want[n * 4 + k]));
  std::vector<float> cpu_kn(8);
  ASSERT_TRUE(DequantizeCpu(kn, DType::kF32, 0, 4, cpu_kn.data(), 3).ok());
  EXPECT_EQ(cpu_kn, got_kn);
}

// Tensor strategy, one fp32 scale 1.0078125: the fp32 product stays (1.5 * s = 1.51171875 exact
// in fp32), and a bf16 output rounds it once (tie -> even: 1.515625 = 0x3FC2).
TEST(CompressedTensorsFp8Test, TensorFp32ScaleKeepsTheFp32Product) {
  const float scale = 1.0078125f;
  const QuantShape shape = ctf::MakeShape(4, 2, 2, 4, DType::kF32);  // R = N, C = K
  ASSERT_TRUE(ValidateShape(shape, DType::kF32).ok());
  EXPECT_EQ(TensorSpecOf(shape, ctf::kWeightScale).elements(), 1);
  const QuantView view = ctf::MakeView(shape, kWeight2x4, &scale);
  std::vector<float> out(8);
  ASSERT_TRUE(DequantizeReference(view, DType::kF32, 0, 2, out.data()).ok());
  EXPECT_EQ(out[0], 2.015625f);
  EXPECT_EQ(out[1], 1.51171875f);
  EXPECT_EQ(out[2], 3.0234375f);
  EXPECT_EQ(out[6], 448.0f * 1.0078125f);
  EXPECT_EQ(out[7], std::ldexp(1.0078125f, -9));
  std::vector<uint16_t> bf16(8);
  ASSERT_TRUE(DequantizeReference(view, DType::kBF16, 0, 2, bf16.data()).ok());
  EXPECT_EQ(bf16[1], 0x3FC2);
  std::vector<uint16_t> cpu(8);
  ASSERT_TRUE(DequantizeCpu(view, DType::kBF16, 0, 2, cpu.data(), 1).ok());
  EXPECT_EQ(cpu, bf16);
}

// Block strategy [R, C] = [2, 4] over N = 3, K = 5: a (ceil(3/2), ceil(5/4)) = (2, 2) grid whose
// last block row and column are partial. Every weight is 1.0 (0x38), so w[n, k] = s[n/2][k/4]:
// rows 0 and 1 read 1 1 1 1 2, row 2 reads 4 4 4 4 8. fp16 scales, fp32 output.
TEST(CompressedTensorsFp8Test, BlockGridWithPartialEdgeBlocks) {
  const std::vector<uint8_t> weight(15, 0x38);
  const uint16_t scale[4] = {0x3C00, 0x4000, 0x4400, 0x4800};  // fp16 1, 2, 4, 8
  const QuantShape shape = ctf::MakeShape(5, 3, 2, 4, DType::kF16);
  ASSERT_TRUE(ValidateShape(shape, DType::kF32).ok());
  EXPECT_EQ(TensorSpecOf(shape, ctf::kWeightScale).rows, 2);
  EXPECT_EQ(TensorSpecOf(shape, ctf::kWeightScale).cols, 2);
  const QuantView view = ctf::MakeView(shape, weight.data(), scale);
  const std::vector<float> want = {1, 1, 1, 1, 2, 1, 1, 1, 1, 2, 4, 4, 4, 4, 8};
  std::vector<float> nk(15);
  ASSERT_TRUE(DequantizeReference(view, DType::kF32, 0, 3, nk.data()).ok());
  EXPECT_EQ(nk, want);
  for (int threads : {1, 2, 3}) {
    const cpu::CpuDequantOptions options{.threads = threads, .min_elements_per_thread = 1};
    std::vector<float> cpu(15);
    ASSERT_TRUE(cpu::DequantizeCpuWithOptions(view, DType::kF32, 0, 3, cpu.data(), options).ok());
    EXPECT_EQ(cpu, want) << threads;
    std::vector<float> row2(5);
    ASSERT_TRUE(cpu::DequantizeCpuWithOptions(view, DType::kF32, 2, 3, row2.data(), options).ok());
    EXPECT_EQ(row2, (std::vector<float>{4, 4, 4, 4, 8}));
    QuantView kn = view;
    kn.shape.orientation = Orientation::kKN;
    std::vector<float> cpu_kn(15);
    ASSERT_TRUE(cpu::DequantizeCpuWithOptions(kn, DType::kF32, 0, 5, cpu_kn.data(), options).ok());
    EXPECT_EQ(cpu_kn, (std::vector<float>{1, 1, 4, 1, 1, 4, 1, 1, 4, 1, 1, 4, 2, 2, 8}));
  }
}

// Group strategy (R = 1, C = G = 2) over N = 1, K = 4 and the inline shape's R = 0 (reads as 1).
TEST(CompressedTensorsFp8Test, GroupGridAndAnInlineShapesZeroRows) {
  const uint8_t weight[4] = {0x38, 0x40, 0x38, 0x40};  // 1 2 1 2
  const float scale[2] = {0.5f, -3.0f};
  QuantShape shape = ctf::MakeShape(4, 1, 0, 2, DType::kF32);
  ASSERT_TRUE(ValidateShape(shape, DType::kF32).ok());
  EXPECT_EQ(TensorSpecOf(shape, ctf::kWeightScale).cols, 2);
  std::vector<float> out(4);
  ASSERT_TRUE(
      DequantizeReference(ctf::MakeView(shape, weight, scale), DType::kF32, 0, 1, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{0.5f, 1.0f, -3.0f, -6.0f}));
}

// E4M3 NaN (0x7F) stays NaN; fp16 output overflows to inf above 65504 (448 * 256).
TEST(CompressedTensorsFp8Test, NanAndFp16Overflow) {
  const uint8_t weight[2] = {0x7F, 0x7E};
  const float scale = 256.0f;
  const QuantShape shape = ctf::MakeShape(2, 1, 1, 2, DType::kF32);
  std::vector<uint16_t> out(2);
  ASSERT_TRUE(
      DequantizeReference(ctf::MakeView(shape, weight, &scale), DType::kF16, 0, 1, out.data())
          .ok());
  EXPECT_EQ(out[0] & 0x7C00, 0x7C00);
  EXPECT_NE(out[0] & 0x03FF, 0);  // NaN
  EXPECT_EQ(out[1], 0x7C00);      // +inf
}

// The CPU path against the reference, bit for bit, on random E4M3 bytes (NaN left out: its
// payload is not compared) and random scales of both signs: every grid, every scale and output
// dtype, both orientations, shapes whose (K, N) tiles of 64 and scale blocks do not line up, row
// ranges that start mid-block, 1 to 4 threads.
TEST(CompressedTensorsFp8Test, CpuPathMatchesTheReferenceOnRandomLayers) {
  struct Grid {
    int64_t N, K, R, C;
  };
  const Grid grids[] = {{130, 70, 130, 70}, {130, 70, 1, 70}, {96, 128, 1, 32},
                        {130, 70, 128, 64}, {67, 131, 3, 5},  {1, 1, 1, 1}};
  std::mt19937 rng(21);
  for (const Grid& g : grids) {
    for (DType scale_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const QuantShape shape = ctf::MakeShape(g.K, g.N, g.R, g.C, scale_dtype);
      ASSERT_TRUE(ValidateShape(shape, DType::kF32).ok());
      std::vector<uint8_t> weight(static_cast<size_t>(g.N * g.K));
      for (uint8_t& b : weight) {
        b = static_cast<uint8_t>(rng());
        if ((b & 0x7F) == 0x7F) b = 0x38;
      }
      const TensorSpec spec = TensorSpecOf(shape, ctf::kWeightScale);
      std::vector<uint8_t> scales(static_cast<size_t>(spec.bytes()));
      for (int64_t i = 0; i < spec.elements(); ++i) {
        const float s = std::ldexp(static_cast<float>(rng() % 1000 + 1) / 1000.0f,
                                   static_cast<int>(rng() % 16) - 12) *
                        (rng() % 4 == 0 ? -1.0f : 1.0f);
        if (scale_dtype == DType::kF32) {
          std::memcpy(scales.data() + 4 * i, &s, 4);
        } else {
          const uint16_t h =
              scale_dtype == DType::kBF16 ? FloatToBf16BitsRne(s) : FloatToHalfBitsRne(s);
          std::memcpy(scales.data() + 2 * i, &h, 2);
        }
      }
      for (Orientation o : {Orientation::kNK, Orientation::kKN}) {
        QuantShape oriented = shape;
        oriented.orientation = o;
        const QuantView view = ctf::MakeView(oriented, weight.data(), scales.data());
        const int64_t rows = oriented.result_rows();
        for (DType out : {DType::kF16, DType::kBF16, DType::kF32}) {
          SCOPED_TRACE(std::to_string(g.N) + "x" + std::to_string(g.K) + " grid " +
                       std::to_string(g.R) + "x" + std::to_string(g.C) + " " +
                       std::string(DTypeName(scale_dtype)) + "->" + std::string(DTypeName(out)) +
                       " " + std::string(OrientationName(o)));
          const size_t bytes = static_cast<size_t>(oriented.output_bytes(out));
          std::vector<uint8_t> want(bytes);
          ASSERT_TRUE(DequantizeReference(view, out, 0, rows, want.data()).ok());
          for (int threads : {1, 4}) {
            const cpu::CpuDequantOptions options{.threads = threads, .min_elements_per_thread = 1};
            std::vector<uint8_t> got(bytes, 0xA5);
            ASSERT_TRUE(
                cpu::DequantizeCpuWithOptions(view, out, 0, rows, got.data(), options).ok());
            EXPECT_TRUE(got == want) << threads << " threads";
            const int64_t begin = rows / 3;  // a range starting mid-block
            const int64_t row_bytes = oriented.result_cols() * DTypeSize(out);
            std::vector<uint8_t> part(static_cast<size_t>((rows - begin) * row_bytes), 0xA5);
            ASSERT_TRUE(
                cpu::DequantizeCpuWithOptions(view, out, begin, rows, part.data(), options).ok());
            EXPECT_EQ(0, std::memcmp(part.data(), want.data() + begin * row_bytes, part.size()));
          }
        }
      }
    }
  }
}

TEST(CompressedTensorsFp8Test, ShapeChecksNameTheField) {
  QuantShape shape = ctf::MakeShape(4, 2, 1, 0, DType::kF32);
  EXPECT_THAT(ValidateShape(shape, DType::kF32).message(),
              HasSubstr("group_size (columns per weight_scale block) must be in [1, "));
  shape = ctf::MakeShape(4, 2, -1, 4, DType::kF32);
  EXPECT_THAT(ValidateShape(shape, DType::kF32).message(),
              HasSubstr("scale_block_rows (rows per weight_scale block) must be in [0, "));
  shape = ctf::MakeShape(4, 2, 1, 4, DType::kI32);
  EXPECT_THAT(ValidateShape(shape, DType::kF32).message(), HasSubstr("weight_scale dtype must be"));
  shape = ctf::MakeShape(4, 2, 1, 4, DType::kF32);
  shape.format_flags = 1;
  EXPECT_THAT(ValidateShape(shape, DType::kF32).message(),
              HasSubstr("format_flags must be 0 for compressed_tensors_fp8, got 1"));
}

// The shape from stored tensors through the row, with a declared strategy and without a config.
struct Stored {
  const char* dtype;
  std::vector<int64_t> dims;
};
bool FromStored(const Stored& weight, const Stored& scale, const QuantizationConfig* config,
                QuantShape* shape, StoredTensorProblem* problem) {
  const StoredTensor tensors[2] = {{weight.dtype, weight.dims}, {scale.dtype, scale.dims}};
  return FormatRowOf(Format::kCompressedTensorsFp8)
      .shape_from_stored(absl::MakeConstSpan(tensors), {.config = config}, shape, problem);
}

TEST(CompressedTensorsFp8Test, ShapeFromStoredReadsTheGridOfEachStrategy) {
  QuantShape shape;
  StoredTensorProblem problem;
  // No config: one element is tensor, (N, 1) channel, (N, g) group.
  ASSERT_TRUE(FromStored({"F8_E4M3", {64, 128}}, {"F32", {1}}, nullptr, &shape, &problem));
  EXPECT_EQ(shape.scale_block_rows, 64);
  EXPECT_EQ(shape.group_size, 128);
  EXPECT_EQ(shape.scale_dtype, DType::kF32);
  EXPECT_EQ(shape.orientation, Orientation::kNK);
  ASSERT_TRUE(FromStored({"F8_E4M3", {64, 128}}, {"F32", {}}, nullptr, &shape, &problem));
  EXPECT_EQ(shape.scale_block_rows, 64);
  ASSERT_TRUE(FromStored({"F8_E4M3", {64, 128}}, {"BF16", {64, 1}}, nullptr, &shape, &problem));
  EXPECT_EQ(shape.scale_block_rows, 1);
  EXPECT_EQ(shape.group_size, 128);
  EXPECT_EQ(shape.scale_dtype, DType::kBF16);
  ASSERT_TRUE(FromStored({"F8_E4M3", {64, 128}}, {"F16", {64, 4}}, nullptr, &shape, &problem));
  EXPECT_EQ(shape.group_size, 32);
  // Declared block [128, 128] over (136, 144): (2, 2).
  QuantizationConfig block;
  block.format = Format::kCompressedTensorsFp8;
  block.strategy = "block";
  block.block_rows = 128;
  block.group_size = 128;
  ASSERT_TRUE(FromStored({"F8_E4M3", {136, 144}}, {"F32", {2, 2}}, &block, &shape, &problem));
  EXPECT_EQ(shape.scale_block_rows, 128);
  EXPECT_EQ(shape.group_size, 128);
  EXPECT_EQ(shape.N, 136);
  EXPECT_EQ(shape.K, 144);
  EXPECT_TRUE(ValidateShape(shape, DType::kF16).ok());
}

TEST(CompressedTensorsFp8Test, ShapeFromStoredProblemsNameRoleFieldAndWant) {
  QuantShape shape;
  StoredTensorProblem problem;
  EXPECT_FALSE(FromStored({"BF16", {64, 128}}, {"F32", {1}}, nullptr, &shape, &problem));
  EXPECT_EQ(problem.role, ctf::kWeight);
  EXPECT_EQ(problem.field, "dtype");
  EXPECT_EQ(problem.what, "is BF16, want F8_E4M3 (float-quantized FP8 weights)");
  EXPECT_FALSE(FromStored({"F8_E4M3", {64, 128}}, {"I32", {1}}, nullptr, &shape, &problem));
  EXPECT_EQ(problem.role, ctf::kWeightScale);
  EXPECT_EQ(problem.field, "dtype");
  EXPECT_EQ(problem.what, "is I32, want F32, BF16 or F16");
  QuantizationConfig channel;
  channel.strategy = "channel";
  EXPECT_FALSE(FromStored({"F8_E4M3", {64, 128}}, {"F32", {64, 2}}, &channel, &shape, &problem));
  EXPECT_EQ(problem.role, ctf::kWeightScale);
  EXPECT_EQ(problem.field, "shape");
  EXPECT_EQ(problem.what,
            "is (64, 2), want (N, 1) = (64, 1) (strategy 'channel' declared, weight (N, K) = "
            "(64, 128))");
  QuantizationConfig tensor;
  tensor.strategy = "tensor";
  EXPECT_FALSE(FromStored({"F8_E4M3", {64, 128}}, {"F32", {64, 1}}, &tensor, &shape, &problem));
  EXPECT_EQ(problem.what,
            "is (64, 1), want (1) (or () or (1, 1)): one scale (strategy 'tensor' declared, "
            "weight (N, K) = (64, 128))");
  QuantizationConfig block;
  block.strategy = "block";
  block.block_rows = 128;
  block.group_size = 128;
  EXPECT_FALSE(FromStored({"F8_E4M3", {136, 144}}, {"F32", {1, 2}}, &block, &shape, &problem));
  EXPECT_EQ(problem.what,
            "is (1, 2), want (ceil(N/R), ceil(K/C)) = (2, 2), block_structure [R, C] = [128, 128] "
            "(strategy 'block' declared, weight (N, K) = (136, 144))");
  // No config and a grid that is none of tensor, channel, group: the block size is unknown.
  EXPECT_FALSE(FromStored({"F8_E4M3", {136, 144}}, {"F32", {2, 2}}, nullptr, &shape, &problem));
  EXPECT_THAT(problem.what, HasSubstr("a block grid needs the checkpoint's config"));
  EXPECT_FALSE(FromStored({"F8_E4M3", {64, 128, 1}}, {"F32", {1}}, nullptr, &shape, &problem));
  EXPECT_EQ(problem.role, ctf::kWeight);
  EXPECT_EQ(problem.what, "has 3 dims, want 2");
}

}  // namespace
}  // namespace dequantd
