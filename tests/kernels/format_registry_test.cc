// Tests for the format registry (kernels/format_registry.h) and the generic entry points over
// it: every Format has its row in order, names round-trip, the AWQ row's specs add up to the
// bytes its layout defines (computed here from the layout, not from the row), an unknown Format
// value is refused before any row is used, and stored tensors give the shape a checkpoint has.
#include "kernels/format_registry.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/awq_format.h"
#include "kernels/compressed_tensors_format.h"
#include "kernels/dequant.h"
#include "kernels/gptq_format.h"

namespace dequantd {
namespace {

using ::testing::HasSubstr;

TEST(FormatRegistryTest, EveryRowIsItsFormatsInOrderWithRolesAndFunctions) {
  ASSERT_FALSE(FormatRows().empty());
  for (size_t i = 0; i < FormatRows().size(); ++i) {
    const FormatRow& row = FormatRows()[i];
    EXPECT_EQ(static_cast<size_t>(row.format), i);
    EXPECT_EQ(&FormatRowOf(row.format), &row);
    EXPECT_GE(row.role_count, 1);
    EXPECT_LE(row.role_count, kMaxTensorRoles);
    EXPECT_GE(row.anchor_role, 0);
    EXPECT_LT(row.anchor_role, row.role_count);
    for (int r = 0; r < row.role_count; ++r) EXPECT_FALSE(row.roles[r].empty()) << row.name;
    EXPECT_NE(row.from_config, nullptr);
    EXPECT_NE(row.shape_from_stored, nullptr);
    EXPECT_NE(row.tensor_spec, nullptr);
    EXPECT_NE(row.validate, nullptr);
    EXPECT_NE(row.reference, nullptr);
    EXPECT_NE(row.cpu, nullptr);
#if DEQUANTD_HAVE_CUDA
    EXPECT_NE(row.cuda, nullptr) << row.name;
#else
    EXPECT_EQ(row.cuda, nullptr) << row.name;
#endif
  }
}

TEST(FormatRegistryTest, NamesAndQuantMethodsRoundTrip) {
  EXPECT_EQ(FormatName(Format::kAwqGemm), "awq_gemm");
  Format f = static_cast<Format>(99);
  ASSERT_TRUE(ParseFormat("AWQ_GEMM", &f));
  EXPECT_EQ(f, Format::kAwqGemm);
  ASSERT_TRUE(ParseFormat("gptq", &f));
  EXPECT_EQ(f, Format::kGptq);
  EXPECT_EQ(FormatName(Format::kGptq), "gptq");
  EXPECT_FALSE(ParseFormat("gptq_v2", &f));
  EXPECT_EQ(FormatName(static_cast<Format>(200)), "unknown");
  ASSERT_NE(FindFormatByQuantMethod("AWQ"), nullptr);
  EXPECT_EQ(FindFormatByQuantMethod("AWQ")->format, Format::kAwqGemm);
  ASSERT_NE(FindFormatByQuantMethod("GPTQ"), nullptr);
  EXPECT_EQ(FindFormatByQuantMethod("GPTQ")->format, Format::kGptq);
  ASSERT_NE(FindFormatByQuantMethod("Compressed-Tensors"), nullptr);
  EXPECT_EQ(FindFormatByQuantMethod("compressed-tensors")->format, Format::kCompressedTensors);
  EXPECT_EQ(FormatName(Format::kCompressedTensors), "compressed_tensors");
  ASSERT_TRUE(ParseFormat("compressed_tensors", &f));
  EXPECT_EQ(f, Format::kCompressedTensors);
  ASSERT_NE(FindFormatByQuantMethod("fp8"), nullptr);
  EXPECT_EQ(FindFormatByQuantMethod("fp8")->format, Format::kFp8Block);
  EXPECT_EQ(FormatName(Format::kFp8Block), "fp8_block");
  // compressed-tensors' float-quantized row shares the quant_method: the lookup finds the
  // pack-quantized row (whose from_config names the row of the checkpoint), the list names it once.
  EXPECT_EQ(FormatName(Format::kCompressedTensorsFp8), "compressed_tensors_fp8");
  ASSERT_TRUE(ParseFormat("compressed_tensors_fp8", &f));
  EXPECT_EQ(f, Format::kCompressedTensorsFp8);
  EXPECT_EQ(FormatRowOf(Format::kCompressedTensorsFp8).quant_method, "compressed-tensors");
  EXPECT_EQ(FormatRowOf(Format::kCompressedTensorsFp8).from_config,
            FormatRowOf(Format::kCompressedTensors).from_config);
  EXPECT_EQ(FormatRowOf(Format::kCompressedTensorsFp8).anchor_role, 1);  // weight_scale
  EXPECT_EQ(FormatRowOf(Format::kCompressedTensorsFp8).default_orientation, Orientation::kNK);
  ASSERT_NE(FindFormatByQuantMethod("MXFP4"), nullptr);
  EXPECT_EQ(FindFormatByQuantMethod("mxfp4")->format, Format::kMxfp4);
  EXPECT_EQ(FormatName(Format::kMxfp4), "mxfp4");
  EXPECT_EQ(FormatRowOf(Format::kMxfp4).role_separator, "_");  // <prefix>_blocks
  EXPECT_TRUE(FormatRowOf(Format::kMxfp4).stacked_experts);
  EXPECT_EQ(FormatRowOf(Format::kAwqGemm).role_separator, ".");
  EXPECT_FALSE(FormatRowOf(Format::kAwqGemm).stacked_experts);
  EXPECT_EQ(ServedQuantMethods(), "'awq', 'gptq', 'compressed-tensors', 'fp8', 'mxfp4'");
}

// Each format's own orientation (what a request naming none gets) and the names.
TEST(FormatRegistryTest, DefaultOrientationsAndOrientationNames) {
  EXPECT_EQ(FormatRowOf(Format::kAwqGemm).default_orientation, Orientation::kKN);
  EXPECT_EQ(FormatRowOf(Format::kGptq).default_orientation, Orientation::kNK);
  EXPECT_EQ(FormatRowOf(Format::kCompressedTensors).default_orientation, Orientation::kNK);
  EXPECT_EQ(FormatRowOf(Format::kFp8Block).default_orientation, Orientation::kNK);
  EXPECT_EQ(FormatRowOf(Format::kMxfp4).default_orientation, Orientation::kKN);  // [E, in, out]
  EXPECT_EQ(OrientationName(Orientation::kKN), "kn");
  EXPECT_EQ(OrientationName(Orientation::kNK), "nk");
  Orientation o = Orientation::kKN;
  ASSERT_TRUE(ParseOrientation("NK", &o));
  EXPECT_EQ(o, Orientation::kNK);
  EXPECT_FALSE(ParseOrientation("t", &o));
  QuantShape shape = awq::MakeShape(256, 64, 128);
  EXPECT_EQ(shape.result_rows(), 256);
  EXPECT_EQ(shape.result_cols(), 64);
  shape.orientation = Orientation::kNK;
  EXPECT_EQ(shape.result_rows(), 64);
  EXPECT_EQ(shape.result_cols(), 256);
  shape.orientation = static_cast<Orientation>(5);
  EXPECT_THAT(ValidateShape(shape, DType::kF16).message(),
              HasSubstr("orientation must be kn or nk, got 5"));
}

// The flags of left-out roles, from the rows' absent_role_flags as written in the registry: only
// optional roles count (GPTQ g_idx; compressed-tensors zero points and g_idx), required ones add
// nothing, and AWQ has no optional role at all.
TEST(FormatRegistryTest, AbsentRoleFlagsAreTheOptionalRolesFlags) {
  EXPECT_EQ(AbsentRoleFlags(Format::kGptq, 1u << gptq::kGidx), gptq::kNoGidx);
  EXPECT_EQ(AbsentRoleFlags(Format::kGptq, (1u << gptq::kQweight) | (1u << gptq::kScales)), 0u);
  EXPECT_EQ(AbsentRoleFlags(Format::kGptq, 0), 0u);
  namespace ct = compressed_tensors;
  EXPECT_EQ(AbsentRoleFlags(Format::kCompressedTensors, 1u << ct::kWeightZeroPoint), ct::kSym);
  EXPECT_EQ(AbsentRoleFlags(Format::kCompressedTensors, (1u << ct::kWeightZeroPoint) |
                                                            (1u << ct::kWeightGidx) |
                                                            (1u << ct::kWeightPacked)),
            ct::kSym | ct::kNoGidx);
  EXPECT_EQ(AbsentRoleFlags(Format::kAwqGemm, 0xFFFFFFFFu), 0u);
}

// K = 256, N = 64, G = 64, 3 bits, no g_idx: qweight 256 * 3 / 32 = 24 rows x 64 int32 = 6144
// bytes, qzeros 4 x (64 * 3 / 32 = 6) int32 = 96, scales 4 x 64 fp16 = 512, g_idx none
// (gptq_format.h's layout, by hand); with g_idx 256 int32 = 1024 more.
TEST(FormatRegistryTest, GptqSpecsAreItsLayoutWithAnOptionalGidx) {
  QuantShape shape = gptq::MakeShape(256, 64, 64, 3, gptq::kNoGidx);
  ASSERT_TRUE(ValidateShape(shape, DType::kF16).ok());
  ASSERT_EQ(TensorRoleCount(Format::kGptq), 4);
  EXPECT_EQ(TensorSpecOf(shape, gptq::kQweight).rows, 24);
  EXPECT_EQ(TensorSpecOf(shape, gptq::kQweight).cols, 64);
  EXPECT_EQ(TensorSpecOf(shape, gptq::kQzeros).rows, 4);
  EXPECT_EQ(TensorSpecOf(shape, gptq::kQzeros).cols, 6);
  EXPECT_EQ(TensorSpecOf(shape, gptq::kGidx).elements(), 0);
  EXPECT_TRUE(RoleAbsent(shape, gptq::kGidx));
  EXPECT_FALSE(RoleAbsent(shape, gptq::kScales));
  EXPECT_EQ(shape.packed_bytes(), 6144 + 96 + 512);
  shape.format_flags = 0;
  EXPECT_FALSE(RoleAbsent(shape, gptq::kGidx));
  EXPECT_EQ(shape.packed_bytes(), 6144 + 96 + 512 + 1024);
  // Shapes the layout cannot hold, named.
  EXPECT_THAT(ValidateShape(gptq::MakeShape(256, 60, 64, 3, 0), DType::kF16).message(),
              HasSubstr("N must be positive with N * bits a multiple of 32"));
  EXPECT_THAT(ValidateShape(gptq::MakeShape(256, 64, 64, 5, 0), DType::kF16).message(),
              HasSubstr("bits must be 2, 3, 4 or 8 for gptq, got 5"));
  EXPECT_THAT(ValidateShape(gptq::MakeShape(256, 64, 96, 4, 0), DType::kF16).message(),
              HasSubstr("K (256) must be a multiple of group_size (96)"));
  EXPECT_THAT(ValidateShape(gptq::MakeShape(256, 64, 64, 4, 8), DType::kF16).message(),
              HasSubstr("format_flags 8 has bits gptq does not define"));
}

// K = 256, N = 64, G = 128, bf16 scales: qweight 256 x 8 int32 = 8192 bytes, qzeros 2 x 8 int32
// = 64, scales 2 x 64 bf16 = 256 (awq_format.h's layout, by hand).
TEST(FormatRegistryTest, AwqSpecsAreItsLayout) {
  const QuantShape shape = awq::MakeShape(256, 64, 128, DType::kBF16);
  ASSERT_TRUE(ValidateShape(shape, DType::kF16).ok());
  ASSERT_EQ(TensorRoleCount(Format::kAwqGemm), 3);
  const TensorSpec qweight = TensorSpecOf(shape, awq::kQweight);
  const TensorSpec qzeros = TensorSpecOf(shape, awq::kQzeros);
  const TensorSpec scales = TensorSpecOf(shape, awq::kScales);
  EXPECT_EQ(qweight.role, "qweight");
  EXPECT_EQ(qweight.dtype, DType::kI32);
  EXPECT_EQ(qweight.rows, 256);
  EXPECT_EQ(qweight.cols, 8);
  EXPECT_EQ(qzeros.role, "qzeros");
  EXPECT_EQ(qzeros.rows, 2);
  EXPECT_EQ(qzeros.cols, 8);
  EXPECT_EQ(scales.role, "scales");
  EXPECT_EQ(scales.dtype, DType::kBF16);
  EXPECT_EQ(scales.rows, 2);
  EXPECT_EQ(scales.cols, 64);
  EXPECT_EQ(shape.packed_bytes(), 8192 + 64 + 256);
  EXPECT_EQ(shape.bytes_moved(DType::kF32), 8192 + 64 + 256 + 256 * 64 * 4);
}

TEST(FormatRegistryTest, UnknownFormatValueIsRefusedByEveryEntryPoint) {
  QuantShape shape = awq::MakeShape(128, 8, 128);
  shape.format = static_cast<Format>(77);
  const absl::Status st = ValidateShape(shape, DType::kF16);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("format 77 is not known"));
  QuantView view;
  view.shape = shape;
  uint16_t out[8 * 128];
  EXPECT_EQ(DequantizeReference(view, DType::kF16, 0, 1, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeCpu(view, DType::kF16, 0, 1, out).code(), absl::StatusCode::kInvalidArgument);
}

TEST(FormatRegistryTest, NullRolePointerIsNamedByItsRole) {
  const QuantShape shape = awq::MakeShape(128, 8, 128);
  static int32_t words[128];
  static uint16_t scales[8];
  uint16_t out[8];
  QuantView view = awq::MakeView(shape, words, words, scales);
  view.tensors[awq::kQzeros] = nullptr;
  const absl::Status st = DequantizeReference(view, DType::kF16, 0, 1, out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "qzeros must not be null");
}

// The AWQ row derives K = 64, N = 8 * 3 = 24, G = 64 / 2 = 32 from (64, 3) I32, (2, 3) I32 and
// (2, 24) F16, and names the role, field and problem when the dims disagree.
TEST(FormatRegistryTest, AwqShapeFromStoredTensors) {
  const FormatRow& row = FormatRowOf(Format::kAwqGemm);
  const std::vector<int64_t> qweight = {64, 3}, qzeros = {2, 3}, scales = {2, 24}, bad = {3, 3};
  std::vector<StoredTensor> stored = {{"I32", qweight}, {"I32", qzeros}, {"F16", scales}};
  QuantShape shape;
  StoredTensorProblem problem;
  ASSERT_TRUE(row.shape_from_stored(stored, {}, &shape, &problem)) << problem.what;
  EXPECT_EQ(shape, awq::MakeShape(64, 24, 32, DType::kF16));
  stored[awq::kQzeros] = {"I32", bad};
  EXPECT_FALSE(row.shape_from_stored(stored, {}, &shape, &problem));
  EXPECT_EQ(problem.role, awq::kQzeros);
  EXPECT_EQ(problem.field, "shape");
  EXPECT_EQ(problem.what, "is (3, 3), want (2, 3) = (K/G, N/8)");
  stored[awq::kQzeros] = {"U32", qzeros};
  EXPECT_FALSE(row.shape_from_stored(stored, {}, &shape, &problem));
  EXPECT_EQ(problem.what, "is U32, want I32");
  EXPECT_TRUE(row.shape_from_stored(stored, {.packed_u32 = true}, &shape, &problem));
}

}  // namespace
}  // namespace dequantd
