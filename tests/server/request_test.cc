// Tests for server/rpc/request: an inline InlinePackedTensor becomes the right QuantView, and
// each bad field is refused with its exact status code and a message naming the field.
#include "server/rpc/request.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/compressed_tensors_format.h"
#include "kernels/gptq_format.h"
#include "tests/server/test_layer.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;
using ::dequantd::testing::RandomPackedLayer;
using ::dequantd::testing::ToInline;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kNoLimit = int64_t{1} << 40;

// K = 256, N = 16, G = 128, fp16 scales: qweight 256 * 2 * 4 = 2048 bytes, qzeros 2 * 2 * 4 = 16,
// scales 2 * 16 * 2 = 64.
v1::InlinePackedTensor Valid() {
  return ToInline(RandomPackedLayer({.K = 256, .N = 16, .group_size = 128}, 1), 128);
}

TEST(InlineTensorTest, ValidRequestPointsIntoTheRequestBytes) {
  const v1::InlinePackedTensor packed = Valid();
  absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(packed, kNoLimit);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  const QuantView& view = tensor->view();
  EXPECT_EQ(view.shape.K, 256);
  EXPECT_EQ(view.shape.N, 16);
  EXPECT_EQ(view.shape.group_size, 128);
  EXPECT_EQ(view.shape.scale_dtype, DType::kF16);
  EXPECT_FALSE(tensor->copied());
  EXPECT_EQ(static_cast<const void*>(awq::Qweight(view)), packed.qweight().data());
  EXPECT_EQ(static_cast<const void*>(awq::Qzeros(view)), packed.qzeros().data());
  EXPECT_EQ(awq::Scales(view), packed.scales().data());
}

// The same layer given by role (InlinePackedTensor.format + tensors) is the same view as in
// fields 5-7, in any role order.
TEST(InlineTensorTest, TensorsByRoleGiveTheSameView) {
  const v1::InlinePackedTensor legacy = Valid();
  v1::InlinePackedTensor packed = legacy;
  packed.clear_qweight();
  packed.clear_qzeros();
  packed.clear_scales();
  packed.set_format("awq_gemm");
  for (const auto& [role, bytes] :
       {std::pair<const char*, const std::string*>{"scales", &legacy.scales()},
        {"qweight", &legacy.qweight()},
        {"qzeros", &legacy.qzeros()}}) {
    v1::RoleBytes* t = packed.add_tensors();
    t->set_role(role);
    t->set_data(*bytes);
  }
  absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(packed, kNoLimit);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  const QuantView& view = tensor->view();
  EXPECT_EQ(view.shape, awq::MakeShape(256, 16, 128, DType::kF16));
  EXPECT_EQ(static_cast<const void*>(awq::Qweight(view)), packed.tensors(1).data().data());
  EXPECT_EQ(static_cast<const void*>(awq::Qzeros(view)), packed.tensors(2).data().data());
  EXPECT_EQ(awq::Scales(view), packed.tensors(0).data().data());
}

TEST(InlineTensorTest, TensorsByRoleErrorsNameTheRoleOrFormat) {
  const v1::InlinePackedTensor legacy = Valid();
  auto by_role = [&](std::vector<std::string> roles) {
    v1::InlinePackedTensor p = legacy;
    p.clear_qweight();
    p.clear_qzeros();
    p.clear_scales();
    for (const std::string& r : roles) {
      v1::RoleBytes* t = p.add_tensors();
      t->set_role(r);
      t->set_data(r == "qweight"  ? legacy.qweight()
                  : r == "qzeros" ? legacy.qzeros()
                                  : legacy.scales());
    }
    return p;
  };
  auto message = [](const v1::InlinePackedTensor& p) {
    absl::StatusOr<InlineTensor> t = InlineTensor::FromProto(p, kNoLimit);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(t.status().message());
  };
  EXPECT_EQ(message(by_role({"qweight", "qzeros"})), "packed.tensors: role 'scales' is missing");
  EXPECT_EQ(message(by_role({"qweight", "qzeros", "scales", "qzeros"})),
            "packed.tensors: role 'qzeros' is given twice");
  EXPECT_EQ(message(by_role({"qweight", "qzeros", "g_idx"})),
            "packed.tensors: role 'g_idx' is not a tensor of format awq_gemm");
  v1::InlinePackedTensor both = by_role({"qweight", "qzeros", "scales"});
  both.set_qweight(legacy.qweight());
  EXPECT_THAT(message(both), HasSubstr("not both"));
  v1::InlinePackedTensor awq_declared_v1 = legacy;
  awq_declared_v1.set_checkpoint_format("gptq");
  EXPECT_EQ(message(awq_declared_v1),
            "packed.checkpoint_format is for format gptq only, got 'gptq' with format awq_gemm");
  v1::InlinePackedTensor unknown = legacy;
  unknown.set_format("marlin");
  EXPECT_EQ(message(unknown),
            "packed.format 'marlin' is not known; served: 'awq_gemm', 'gptq', "
            "'compressed_tensors', 'fp8_block', 'compressed_tensors_fp8', 'mxfp4'");
}

// Appends role `role` of `bytes` zero bytes to an inline request's tensors.
v1::RoleBytes* AddRole(v1::InlinePackedTensor& packed, const char* role, size_t bytes) {
  v1::RoleBytes* t = packed.add_tensors();
  t->set_role(role);
  t->mutable_data()->assign(bytes, '\0');
  return t;
}

// An inline GPTQ layer (K = 64, N = 8, G = 32, 4 bits, gptq_v2 zeros, with g_idx: what inline
// requests carry): qweight (8, 8) int32, qzeros (2, 1), scales (2, 8) fp16, g_idx (64). Its
// stored values are checked as at checkpoint load.
TEST(InlineTensorTest, GptqByRoleHasItsShapeAndItsGidxChecked) {
  v1::InlinePackedTensor packed;
  packed.set_format("gptq");
  packed.set_checkpoint_format("gptq_v2");
  packed.set_in_features(64);
  packed.set_out_features(8);
  packed.set_group_size(32);
  const auto add = [&](const char* role, size_t bytes) { return AddRole(packed, role, bytes); };
  add("qweight", 8 * 8 * 4);
  add("qzeros", 2 * 1 * 4);
  add("scales", 2 * 8 * 2);
  v1::RoleBytes* g_idx = add("g_idx", 64 * 4);
  for (int32_t k = 0; k < 64; ++k) {
    const int32_t g = k / 32;
    std::memcpy(g_idx->mutable_data()->data() + 4 * k, &g, 4);
  }
  absl::StatusOr<InlineTensor> ok = InlineTensor::FromProto(packed, int64_t{1} << 20);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->view().shape.format, Format::kGptq);
  EXPECT_EQ(ok->view().shape.orientation, Orientation::kNK);
  EXPECT_EQ(ok->view().shape.bits, 4);
  EXPECT_EQ(ok->view().shape.format_flags & gptq::kZerosV1, 0u);
  // The zero convention is the request's: "gptq" zeros are stored minus one; none is refused.
  packed.set_checkpoint_format("gptq");
  absl::StatusOr<InlineTensor> v1_zeros = InlineTensor::FromProto(packed, int64_t{1} << 20);
  ASSERT_TRUE(v1_zeros.ok()) << v1_zeros.status();
  EXPECT_EQ(v1_zeros->view().shape.format_flags & gptq::kZerosV1, gptq::kZerosV1);
  packed.clear_checkpoint_format();
  EXPECT_EQ(InlineTensor::FromProto(packed, int64_t{1} << 20).status().message(),
            "packed.checkpoint_format must be 'gptq' (zeros stored minus one) or 'gptq_v2' for "
            "format gptq, got ''");
  packed.set_checkpoint_format("gptq_v3");
  EXPECT_EQ(InlineTensor::FromProto(packed, int64_t{1} << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
  packed.set_checkpoint_format("gptq_v2");
  // bits: GPTQ's own check refuses a width it does not have.
  packed.set_bits(5);
  EXPECT_THAT(InlineTensor::FromProto(packed, int64_t{1} << 20).status().message(),
              HasSubstr("bits must be 2, 3, 4 or 8 for gptq, got 5"));
  packed.clear_bits();
  const int32_t bad = 7;
  std::memcpy(g_idx->mutable_data()->data() + 4 * 5, &bad, 4);
  const absl::StatusOr<InlineTensor> refused = InlineTensor::FromProto(packed, int64_t{1} << 20);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "packed: g_idx[5] is 7, want [0, 2) (groups = K / group_size = 64 / 32)");
  // g_idx is optional: left out (or given no bytes) the layer stores none (kNoGidx), as a
  // checkpoint layer without it; a required role left out is named.
  packed.mutable_tensors()->RemoveLast();
  absl::StatusOr<InlineTensor> no_gidx = InlineTensor::FromProto(packed, int64_t{1} << 20);
  ASSERT_TRUE(no_gidx.ok()) << no_gidx.status();
  EXPECT_EQ(no_gidx->view().shape.format_flags, gptq::kNoGidx);
  EXPECT_EQ(no_gidx->view().tensors[gptq::kGidx], nullptr);
  add("g_idx", 0);
  absl::StatusOr<InlineTensor> empty_gidx = InlineTensor::FromProto(packed, int64_t{1} << 20);
  ASSERT_TRUE(empty_gidx.ok()) << empty_gidx.status();
  EXPECT_EQ(empty_gidx->view().shape.format_flags, gptq::kNoGidx);
  packed.mutable_tensors()->DeleteSubrange(1, 1);  // qzeros
  EXPECT_EQ(InlineTensor::FromProto(packed, int64_t{1} << 20).status().message(),
            "packed.tensors: role 'qzeros' is missing");
}

// compressed_tensors without weight_zero_point and weight_g_idx (symmetric, groups k / G): the
// request leaves them out and the shape says so (kSym | kNoGidx), as at checkpoint load; a scale
// grid of several rows per scale is compressed_tensors_fp8's alone.
TEST(InlineTensorTest, CompressedTensorsWithoutOptionalRolesIsSymmetricWithoutGidx) {
  v1::InlinePackedTensor packed;
  packed.set_format("compressed_tensors");
  packed.set_in_features(64);
  packed.set_out_features(8);
  packed.set_group_size(32);
  packed.set_scale_dtype(v1::DTYPE_FP16);
  const auto add = [&](const char* role, size_t bytes) { return AddRole(packed, role, bytes); };
  add("weight_packed", 8 * 8 * 4);
  add("weight_scale", 8 * 2 * 2);
  v1::RoleBytes* dense = add("weight_shape", 16);
  const int64_t nk[2] = {8, 64};
  std::memcpy(dense->mutable_data()->data(), nk, 16);
  absl::StatusOr<InlineTensor> ok = InlineTensor::FromProto(packed, int64_t{1} << 20);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->view().shape.format_flags, compressed_tensors::kSym | compressed_tensors::kNoGidx);
  EXPECT_EQ(ok->view().tensors[compressed_tensors::kWeightZeroPoint], nullptr);
  packed.set_scale_block_rows(8);
  EXPECT_EQ(InlineTensor::FromProto(packed, int64_t{1} << 20).status().message(),
            "packed.scale_block_rows is for format compressed_tensors_fp8 only, got 8 with format "
            "compressed_tensors");
}

// compressed_tensors_fp8, strategy tensor: one scale for the whole (N, K) weight, R = N, C = K.
TEST(InlineTensorTest, CompressedTensorsFp8TensorStrategyTakesScaleBlockRows) {
  v1::InlinePackedTensor packed;
  packed.set_format("compressed_tensors_fp8");
  packed.set_in_features(16);
  packed.set_out_features(4);
  packed.set_group_size(16);
  packed.set_scale_dtype(v1::DTYPE_FP32);
  packed.set_scale_block_rows(4);
  v1::RoleBytes* weight = packed.add_tensors();
  weight->set_role("weight");
  weight->mutable_data()->assign(4 * 16, '\0');
  v1::RoleBytes* scale = packed.add_tensors();
  scale->set_role("weight_scale");
  scale->mutable_data()->assign(4, '\0');
  absl::StatusOr<InlineTensor> ok = InlineTensor::FromProto(packed, int64_t{1} << 20);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->view().shape.scale_block_rows, 4);
  packed.set_scale_block_rows(0);  // one scale row per weight row: (4, 1) scales
  EXPECT_EQ(std::string(InlineTensor::FromProto(packed, int64_t{1} << 20).status().message()),
            "packed.weight_scale has 4 bytes, expected 16 (4 * 1 * 4 (fp32))");
}

// An inline compressed_tensors layer: int4, group strategy, asymmetric, with weight_g_idx and
// weight_shape (every role), its stored values checked as at load.
TEST(InlineTensorTest, CompressedTensorsByRoleHasItsShapeAndItsWeightShapeChecked) {
  v1::InlinePackedTensor packed;
  packed.set_format("compressed_tensors");
  packed.set_in_features(64);
  packed.set_out_features(8);
  packed.set_group_size(32);
  packed.set_scale_dtype(v1::DTYPE_BF16);
  const auto add = [&](const char* role, size_t bytes) { return AddRole(packed, role, bytes); };
  add("weight_packed", 8 * 8 * 4);
  add("weight_scale", 8 * 2 * 2);
  add("weight_zero_point", 1 * 2 * 4);
  v1::RoleBytes* g_idx = add("weight_g_idx", 64 * 4);
  for (int32_t k = 0; k < 64; ++k) {
    const int32_t g = k / 32;
    std::memcpy(g_idx->mutable_data()->data() + 4 * k, &g, 4);
  }
  v1::RoleBytes* dense = add("weight_shape", 16);
  const int64_t nk[2] = {8, 64};
  std::memcpy(dense->mutable_data()->data(), nk, 16);
  absl::StatusOr<InlineTensor> ok = InlineTensor::FromProto(packed, int64_t{1} << 20);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->view().shape.format, Format::kCompressedTensors);
  EXPECT_EQ(ok->view().shape.orientation, Orientation::kNK);
  EXPECT_EQ(ok->view().shape.bits, 4);
  EXPECT_EQ(ok->view().shape.format_flags, 0u);
  EXPECT_EQ(ok->view().shape.scale_dtype, DType::kBF16);
  const int64_t wrong[2] = {8, 60};
  std::memcpy(dense->mutable_data()->data(), wrong, 16);
  const absl::StatusOr<InlineTensor> refused = InlineTensor::FromProto(packed, int64_t{1} << 20);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::StartsWith("packed: weight_shape is (8, 60), want (N, K) = (8, 64)"));
  dense->mutable_data()->resize(8);
  EXPECT_THAT(std::string(InlineTensor::FromProto(packed, int64_t{1} << 20).status().message()),
              ::testing::HasSubstr("weight_shape"));
}

TEST(InlineTensorTest, GroupSizeMinusOneMeansK) {
  const v1::InlinePackedTensor packed =
      ToInline(RandomPackedLayer({.K = 256, .N = 16, .group_size = 256}, 2), -1);
  absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(packed, kNoLimit);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->view().shape.group_size, 256);
}

TEST(InlineTensorTest, UnspecifiedScaleDtypeIsFp16AndBf16IsKept) {
  v1::InlinePackedTensor packed = Valid();
  packed.set_scale_dtype(v1::DTYPE_UNSPECIFIED);
  absl::StatusOr<InlineTensor> fp16 = InlineTensor::FromProto(packed, kNoLimit);
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  EXPECT_EQ(fp16->view().shape.scale_dtype, DType::kF16);

  packed.set_scale_dtype(v1::DTYPE_BF16);
  absl::StatusOr<InlineTensor> bf16 = InlineTensor::FromProto(packed, kNoLimit);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->view().shape.scale_dtype, DType::kBF16);
}

TEST(InlineTensorTest, MisalignedBytesAreCopiedToAlignedStorage) {
  const v1::InlinePackedTensor packed = Valid();
  // The same bytes, back to back from 1 byte past a 4-byte boundary (2048 and 16 are multiples
  // of 4, so all three start misaligned).
  std::vector<char> buffer(4 + packed.qweight().size() + packed.qzeros().size() +
                           packed.scales().size());
  char* qweight = buffer.data() + (4 - reinterpret_cast<uintptr_t>(buffer.data()) % 4) % 4 + 1;
  std::memcpy(qweight, packed.qweight().data(), packed.qweight().size());
  char* qzeros = qweight + packed.qweight().size();
  std::memcpy(qzeros, packed.qzeros().data(), packed.qzeros().size());
  char* scales = qzeros + packed.qzeros().size();
  std::memcpy(scales, packed.scales().data(), packed.scales().size());
  ASSERT_EQ(reinterpret_cast<uintptr_t>(qweight) % 4, 1u);

  const std::string_view parts[] = {{qweight, packed.qweight().size()},
                                    {qzeros, packed.qzeros().size()},
                                    {scales, packed.scales().size()}};
  absl::StatusOr<InlineTensor> tensor = InlineTensor::FromParts(packed, parts, kNoLimit);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_TRUE(tensor->copied());
  const QuantView& view = tensor->view();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(awq::Qweight(view)) % 4, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(awq::Qzeros(view)) % 4, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(awq::Scales(view)) % 4, 0u);
  EXPECT_EQ(std::memcmp(awq::Qweight(view), packed.qweight().data(), packed.qweight().size()), 0);
  EXPECT_EQ(std::memcmp(awq::Qzeros(view), packed.qzeros().data(), packed.qzeros().size()), 0);
  EXPECT_EQ(std::memcmp(awq::Scales(view), packed.scales().data(), packed.scales().size()), 0);

  // The view survives a move of the InlineTensor.
  InlineTensor moved = std::move(*tensor);
  EXPECT_EQ(
      std::memcmp(awq::Qweight(moved.view()), packed.qweight().data(), packed.qweight().size()), 0);
}

struct BadCase {
  const char* name;
  void (*mutate)(v1::InlinePackedTensor&);
  absl::StatusCode code;
  const char* field;    // substring naming the field
  const char* numbers;  // expected vs actual, or the bad value
};

class InlineTensorBadFieldTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(InlineTensorBadFieldTest, IsRefusedNamingTheField) {
  v1::InlinePackedTensor packed = Valid();
  GetParam().mutate(packed);
  absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(packed, kNoLimit);
  ASSERT_FALSE(tensor.ok());
  EXPECT_EQ(tensor.status().code(), GetParam().code) << tensor.status();
  EXPECT_THAT(std::string(tensor.status().message()),
              AllOf(HasSubstr(GetParam().field), HasSubstr(GetParam().numbers)));
}

INSTANTIATE_TEST_SUITE_P(
    AllFields, InlineTensorBadFieldTest,
    ::testing::Values(
        BadCase{
            "QweightShort", [](v1::InlinePackedTensor& p) { p.mutable_qweight()->resize(2044); },
            absl::StatusCode::kInvalidArgument, "packed.qweight", "has 2044 bytes, expected 2048"},
        BadCase{"QweightLong", [](v1::InlinePackedTensor& p) { p.mutable_qweight()->resize(2052); },
                absl::StatusCode::kInvalidArgument, "packed.qweight",
                "has 2052 bytes, expected 2048"},
        BadCase{"QzerosShort", [](v1::InlinePackedTensor& p) { p.mutable_qzeros()->resize(12); },
                absl::StatusCode::kInvalidArgument, "packed.qzeros", "has 12 bytes, expected 16"},
        BadCase{"ScalesShort", [](v1::InlinePackedTensor& p) { p.mutable_scales()->resize(62); },
                absl::StatusCode::kInvalidArgument, "packed.scales", "has 62 bytes, expected 64"},
        // bf16 scales are 2 bytes too: the 64 given are right; fp32 is fp8_block's scale dtype,
        // which AWQ's shape check refuses.
        BadCase{"ScaleDtypeFp32",
                [](v1::InlinePackedTensor& p) { p.set_scale_dtype(v1::DTYPE_FP32); },
                absl::StatusCode::kInvalidArgument, "packed.scale_dtype: scales dtype", "got fp32"},
        BadCase{"ScaleDtypeInt32",
                [](v1::InlinePackedTensor& p) { p.set_scale_dtype(v1::DTYPE_INT32); },
                absl::StatusCode::kInvalidArgument, "packed.scale_dtype", "DTYPE_INT32"},
        // Scales/qzeros for G = 64 (4 groups) sent with group_size 128: qzeros has 32 bytes.
        BadCase{"QzerosForAnotherGroupSize",
                [](v1::InlinePackedTensor& p) { p.mutable_qzeros()->resize(32); },
                absl::StatusCode::kInvalidArgument, "packed.qzeros", "has 32 bytes, expected 16"},
        BadCase{"NNotMultipleOf8", [](v1::InlinePackedTensor& p) { p.set_out_features(12); },
                absl::StatusCode::kInvalidArgument, "N must be", "got 12"},
        BadCase{"KNotMultipleOfGroupSize",
                [](v1::InlinePackedTensor& p) { p.set_in_features(200); },
                absl::StatusCode::kInvalidArgument, "group_size", "K (200)"},
        BadCase{"KZero", [](v1::InlinePackedTensor& p) { p.set_in_features(0); },
                absl::StatusCode::kInvalidArgument, "K must be", "got 0"},
        BadCase{"GroupSizeZero", [](v1::InlinePackedTensor& p) { p.set_group_size(0); },
                absl::StatusCode::kInvalidArgument, "group_size", "got 0"},
        BadCase{"GroupSizeMinusTwo", [](v1::InlinePackedTensor& p) { p.set_group_size(-2); },
                absl::StatusCode::kInvalidArgument, "group_size", "got -2"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

TEST(InlineTensorTest, ShapeErrorsSayPacked) {
  v1::InlinePackedTensor packed = Valid();
  packed.set_out_features(12);
  absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(packed, kNoLimit);
  ASSERT_FALSE(tensor.ok());
  EXPECT_THAT(std::string(tensor.status().message()), ::testing::StartsWith("packed: "));
}

TEST(InlineTensorTest, LargerThanMaxRequestBytesIsResourceExhausted) {
  const v1::InlinePackedTensor packed = Valid();  // 2048 + 16 + 64 = 2128 bytes
  EXPECT_TRUE(InlineTensor::FromProto(packed, 2128).ok());
  absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(packed, 2127);
  ASSERT_FALSE(tensor.ok());
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(tensor.status().message()),
              AllOf(HasSubstr("2128 bytes"), HasSubstr("max_request_bytes = 2127")));
}

TEST(OutputDTypeTest, MapsEveryWireDtype) {
  EXPECT_EQ(*OutputDTypeFromProto(v1::DTYPE_UNSPECIFIED), DType::kF16);
  EXPECT_EQ(*OutputDTypeFromProto(v1::DTYPE_FP16), DType::kF16);
  EXPECT_EQ(*OutputDTypeFromProto(v1::DTYPE_BF16), DType::kBF16);
  EXPECT_EQ(*OutputDTypeFromProto(v1::DTYPE_FP32), DType::kF32);

  absl::StatusOr<DType> int32 = OutputDTypeFromProto(v1::DTYPE_INT32);
  ASSERT_FALSE(int32.ok());
  EXPECT_EQ(int32.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(int32.status().message()),
              AllOf(HasSubstr("output_dtype"), HasSubstr("DTYPE_INT32")));

  absl::StatusOr<DType> unknown = OutputDTypeFromProto(static_cast<v1::DType>(99));
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()),
              AllOf(HasSubstr("output_dtype"), HasSubstr("99")));
}

TEST(OutputDTypeTest, RoundTripsToProto) {
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
    EXPECT_EQ(*OutputDTypeFromProto(DTypeToProto(dtype)), dtype);
  }
  EXPECT_EQ(DTypeToProto(DType::kI32), v1::DTYPE_INT32);
}

TEST(EffectiveChunkBytesTest, DefaultsClampsAndRefusesNegative) {
  EXPECT_EQ(*EffectiveChunkBytes(0, 1 << 20), 1 << 20);
  EXPECT_EQ(*EffectiveChunkBytes(1, 1 << 20), 64 << 10);
  EXPECT_EQ(*EffectiveChunkBytes(100000, 1 << 20), 100000);
  // The largest payload: 4 MiB - 4 KiB, so a message with its tags stays within 4 MiB.
  EXPECT_EQ(*EffectiveChunkBytes(64 << 20, 1 << 20), 4190208);
  EXPECT_EQ(*EffectiveChunkBytes(4 << 20, 1 << 20), 4190208);
  for (int64_t negative : {int64_t{-1}, int64_t{-5}, INT64_MIN}) {
    absl::StatusOr<int64_t> bytes = EffectiveChunkBytes(negative, 1 << 20);
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument) << negative;
    EXPECT_THAT(std::string(bytes.status().message()), HasSubstr("chunk_bytes")) << negative;
  }
}

}  // namespace
}  // namespace dequantd
