// compressed-tensors float-quantized FP8 against the library's own results: the float-quantized
// cases of tests/data/formats/compressed_tensors/ (ct_fp8_tensor_fp32, ct_fp8_channel_bf16: made
// by tools/format_vectors/make_vectors.py with compressed-tensors 0.20.0's
// FloatQuantizationCompressor) are opened as checkpoints (config.json through the registry:
// quant_method "compressed-tensors" finds the pack-quantized row, whose from_config names the
// compressed_tensors_fp8 row for `format: float-quantized`), and the layer is dequantized by the
// CPU reference and the CPU path in both orientations into fp16, bf16 and fp32, compared bit for
// bit with the library's expected.<dtype> ((N, K)). Also the refusals a float-quantized
// checkpoint can earn, with their exact codes and messages, input_scale kept as a raw tensor, a
// checkpoint served end to end on the CPU backend, and (GPU only) the CUDA backend on both cases.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/compressed_tensors_fp8_format.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/dequant.h"
#include "kernels/dtype.h"
#include "server/backend/backend.h"
#include "server/model/checkpoint.h"
#include "server/rpc/request.h"
#if DEQUANTD_HAVE_CUDA
#include "server/backend/cuda/cuda_backend.h"
#endif
#include "tests/server/cpu_test_server.h"
#include "tests/server/format_vectors.h"

namespace dequantd {
namespace {

namespace fs = std::filesystem;
namespace ctf = compressed_tensors_fp8;
using ::testing::HasSubstr;
using testing::MakeCheckpoint;
using testing::ReadText;
using testing::TensorOf;
using testing::TransposeNk;

constexpr char kLayer[] = "model.layers.0.mlp.down_proj";

fs::path VectorDir() { return testing::VectorDir("compressed_tensors"); }
fs::path CaseFile(const char* name) { return VectorDir() / (std::string(name) + ".safetensors"); }
std::string CaseConfig(const char* name) {
  return ReadText(VectorDir() / (std::string(name) + ".config.json"));
}

struct Case {
  const char* name;
  int64_t rows_per_scale;  // R as the shape holds it (tensor: N)
  int64_t cols_per_scale;  // C = group_size (tensor, channel: K)
  DType scale_dtype;
  int64_t N;
  int64_t K;
};

// docs/formats/compressed_tensors.md "Cases" (the float-quantized ones).
constexpr Case kCases[] = {
    {"ct_fp8_tensor_fp32", 64, 128, DType::kF32, 64, 128},
    {"ct_fp8_channel_bf16", 1, 128, DType::kBF16, 64, 128},
};

constexpr DType kOutDtypes[] = {DType::kF16, DType::kBF16, DType::kF32};

std::string ExpectedName(DType out) {
  return std::string("expected.") + std::string(DTypeName(out));
}

class CompressedTensorsFp8VectorsTest : public ::testing::TestWithParam<Case> {};

// Every CPU path, both orientations, every output dtype, against compressed-tensors' bytes.
TEST_P(CompressedTensorsFp8VectorsTest, CheckpointDequantizesBitExactToCompressedTensors) {
  const Case& c = GetParam();
  const fs::path dir = MakeCheckpoint(CaseConfig(c.name), CaseFile(c.name));
  ASSERT_FALSE(dir.empty());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->config().format, Format::kCompressedTensorsFp8);
  EXPECT_EQ((*ckpt)->config().quant_method, "compressed-tensors");
  EXPECT_EQ((*ckpt)->config().version, "float-quantized");
  ASSERT_EQ((*ckpt)->layers().size(), 1u);
  const QuantizedLayer* layer = (*ckpt)->Find(kLayer);
  ASSERT_NE(layer, nullptr);
  const QuantShape& shape = layer->view.shape;
  EXPECT_EQ(shape.format, Format::kCompressedTensorsFp8);
  EXPECT_EQ(shape.scale_block_rows, c.rows_per_scale);
  EXPECT_EQ(shape.group_size, c.cols_per_scale);
  EXPECT_EQ(shape.format_flags, 0u);
  EXPECT_EQ(shape.scale_dtype, c.scale_dtype);
  EXPECT_EQ(shape.N, c.N);
  EXPECT_EQ(shape.K, c.K);
  EXPECT_EQ(shape.orientation, Orientation::kNK);  // the format's own
  const int64_t K = shape.K;
  const int64_t N = shape.N;

  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(CaseFile(c.name).string());
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  for (DType out : kOutDtypes) {
    SCOPED_TRACE(std::string(DTypeName(out)));
    const std::vector<uint8_t> expected = TensorOf(**vectors, ExpectedName(out));
    const int64_t elem = DTypeSize(out);
    ASSERT_EQ(static_cast<int64_t>(expected.size()), N * K * elem);

    const QuantView nk = layer->view;  // (N, K)
    std::vector<uint8_t> got(expected.size(), 0xA5);
    ASSERT_TRUE(DequantizeReference(nk, out, 0, N, got.data()).ok());
    EXPECT_EQ(got, expected) << "reference (N, K)";
    for (int threads : {1, 3}) {
      const cpu::CpuDequantOptions options{.threads = threads, .min_elements_per_thread = 1};
      std::vector<uint8_t> fast(expected.size(), 0xA5);
      ASSERT_TRUE(cpu::DequantizeCpuWithOptions(nk, out, 0, N, fast.data(), options).ok());
      EXPECT_EQ(fast, expected) << "cpu (N, K), threads " << threads;
      std::vector<uint8_t> part(static_cast<size_t>(25 * K * elem), 0xA5);  // rows [5, 30)
      ASSERT_TRUE(cpu::DequantizeCpuWithOptions(nk, out, 5, 30, part.data(), options).ok());
      EXPECT_EQ(0, std::memcmp(part.data(), expected.data() + 5 * K * elem, part.size()));
    }

    QuantView kn = layer->view;  // (K, N): w_kn[k][n] = w_nk[n][k]
    kn.shape.orientation = Orientation::kKN;
    const std::vector<uint8_t> want_kn = TransposeNk(expected, N, K, elem);
    std::vector<uint8_t> got_kn(expected.size(), 0xA5);
    ASSERT_TRUE(DequantizeReference(kn, out, 0, K, got_kn.data()).ok());
    EXPECT_EQ(got_kn, want_kn) << "reference (K, N)";
    for (int threads : {1, 3}) {
      const cpu::CpuDequantOptions options{.threads = threads, .min_elements_per_thread = 1};
      std::vector<uint8_t> fast(expected.size(), 0xA5);
      ASSERT_TRUE(cpu::DequantizeCpuWithOptions(kn, out, 0, K, fast.data(), options).ok());
      EXPECT_EQ(fast, want_kn) << "cpu (K, N), threads " << threads;
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Cases, CompressedTensorsFp8VectorsTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

// The bf16-scaled case's fp32 result holds bf16 values (computed in the scale dtype, then cast),
// and a single rounding of the exact product would differ from it somewhere: the double rounding
// is what the vector pins (and what the paths above reproduce).
TEST(CompressedTensorsFp8RoundingTest, Fp32OfBf16ScalesIsTheBf16Result) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(CaseFile("ct_fp8_channel_bf16").string());
  ASSERT_TRUE(vectors.ok());
  const std::vector<uint8_t> f32 = TensorOf(**vectors, "expected.fp32");
  const std::vector<uint8_t> bf16 = TensorOf(**vectors, "expected.bf16");
  const std::vector<uint8_t> weight = TensorOf(**vectors, std::string(kLayer) + ".weight");
  const std::vector<uint8_t> scale = TensorOf(**vectors, std::string(kLayer) + ".weight_scale");
  ASSERT_EQ(f32.size(), 2 * bf16.size());
  ASSERT_EQ(weight.size(), 64u * 128u);
  int64_t single_rounding_differs = 0;
  for (size_t i = 0; i < bf16.size() / 2; ++i) {
    uint32_t bits;
    std::memcpy(&bits, f32.data() + 4 * i, 4);
    uint16_t b;
    std::memcpy(&b, bf16.data() + 2 * i, 2);
    ASSERT_EQ(bits, static_cast<uint32_t>(b) << 16) << i;
    uint16_t s;
    std::memcpy(&s, scale.data() + 2 * (i / 128), 2);
    const float exact = Fp8E4m3BitsToFloat(weight[i]) * Bf16BitsToFloat(s);
    uint32_t exact_bits;
    std::memcpy(&exact_bits, &exact, 4);
    single_rounding_differs += exact_bits != bits;
  }
  EXPECT_GT(single_rounding_differs, 0);
}

// ---- Refusals ----------------------------------------------------------------------------------

// A case's config.json with `from` replaced by `to` (the JSON is one key per line).
std::string EditedConfig(const char* case_name, const std::string& from, const std::string& to) {
  std::string text = CaseConfig(case_name);
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

absl::Status OpenWith(const std::string& config, const fs::path& safetensors) {
  const fs::path dir = MakeCheckpoint(config, safetensors);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  fs::remove_all(dir);
  return ckpt.status();
}

absl::Status OpenEditedConfig(const char* case_name, const std::string& from,
                              const std::string& to) {
  return OpenWith(EditedConfig(case_name, from, to), CaseFile(case_name));
}

TEST(CompressedTensorsFp8CheckpointTest, NumBitsOtherThan8IsInvalidArgument) {
  const absl::Status s =
      OpenEditedConfig("ct_fp8_channel_bf16", "\"num_bits\": 8", "\"num_bits\": 4");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("quantization_config field 'config_groups/group_0/weights/num_bits' is 4, "
                        "only 8 (FP8 E4M3) is served for format 'float-quantized'"));
}

TEST(CompressedTensorsFp8CheckpointTest, TypeOtherThanFloatIsInvalidArgument) {
  const absl::Status s =
      OpenEditedConfig("ct_fp8_channel_bf16", "\"type\": \"float\"", "\"type\": \"int\"");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("field 'config_groups/group_0/weights/type' is 'int', only 'float' is "
                        "served for format 'float-quantized'"));
}

TEST(CompressedTensorsFp8CheckpointTest, UnknownStrategyIsInvalidArgument) {
  const absl::Status s = OpenEditedConfig("ct_fp8_channel_bf16", "\"strategy\": \"channel\"",
                                          "\"strategy\": \"tensor_group\"");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("field 'config_groups/group_0/weights/strategy' is 'tensor_group', only "
                        "'group', 'channel', 'tensor' and 'block' are served for format "
                        "'float-quantized'"));
}

TEST(CompressedTensorsFp8CheckpointTest, BlockWithoutBlockStructureIsInvalidArgument) {
  const absl::Status s = OpenEditedConfig("ct_fp8_channel_bf16", "\"strategy\": \"channel\"",
                                          "\"strategy\": \"block\"");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("field 'config_groups/group_0/weights/block_structure' must be [rows, "
                        "cols] of two integers in [1, 1099511627776] for strategy 'block' (e.g. "
                        "[128, 128])"));
}

TEST(CompressedTensorsFp8CheckpointTest, AsymmetricIsInvalidArgument) {
  const absl::Status s =
      OpenEditedConfig("ct_fp8_channel_bf16", "\"symmetric\": true", "\"symmetric\": false");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("field 'config_groups/group_0/weights/symmetric' is false; "
                                     "only symmetric FP8 weights are served"));
}

// One format per checkpoint: compressed-tensors' "mixed-precision" top-level format, and a group
// whose own format differs from the top one, are refused at the config.
TEST(CompressedTensorsFp8CheckpointTest, MixedFormatsAreInvalidArgument) {
  absl::Status s = OpenEditedConfig("ct_fp8_channel_bf16", "\"format\": \"float-quantized\"",
                                    "\"format\": \"mixed-precision\"");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("field 'format' is 'mixed-precision', only 'pack-quantized' "
                                     "and 'float-quantized' are served (one format per "
                                     "checkpoint)"));
  s = OpenEditedConfig("ct_fp8_channel_bf16", "\"format\": null", "\"format\": \"pack-quantized\"");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("field 'config_groups/group_0/format' is 'pack-quantized', the "
                        "checkpoint's format is 'float-quantized'; one format per checkpoint is "
                        "served (mixed formats are not)"));
}

// A float-quantized declaration over a pack-quantized layer (weight_packed, weight_scale,
// weight_shape): the layer's weight_scale marks it, and its missing `.weight` is named.
TEST(CompressedTensorsFp8CheckpointTest, PackQuantizedLayerUnderAFloatConfigNamesTheTensor) {
  const absl::Status s =
      OpenWith(CaseConfig("ct_fp8_channel_bf16"), CaseFile("ct_int8_channel_sym_bf16"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr(": tensor 'model.layers.0.mlp.down_proj.weight_scale' (layer "
                        "'model.layers.0.mlp.down_proj', format compressed_tensors_fp8): the layer "
                        "has no weight tensor: 'model.layers.0.mlp.down_proj.weight' is missing"));
}

// The tensor-strategy file under a channel declaration: weight_scale (1) is named with the shape
// the strategy wants.
TEST(CompressedTensorsFp8CheckpointTest, ScaleShapeNotMatchingTheStrategyNamesWeightScale) {
  const absl::Status s =
      OpenWith(CaseConfig("ct_fp8_channel_bf16"), CaseFile("ct_fp8_tensor_fp32"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor 'model.layers.0.mlp.down_proj.weight_scale' (layer "
                        "'model.layers.0.mlp.down_proj'): field 'shape' is (1), want (N, 1) = "
                        "(64, 1) (strategy 'channel' declared, weight (N, K) = (64, 128))"));
}

// A copy of a case's layer tensors with `suffix` given another dtype (same bytes) and `extra`
// tensors added.
fs::path CheckpointWith(const char* case_name, const std::string& suffix, const std::string& dtype,
                        const std::vector<safetensors::TensorToWrite>& extra) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> src =
      safetensors::MappedFile::Open(CaseFile(case_name).string());
  EXPECT_TRUE(src.ok());
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve((*src)->header().tensors.size());
  std::vector<safetensors::TensorToWrite> tensors = extra;
  for (const auto& [name, entry] : (*src)->header().tensors) {
    if (name.rfind(kLayer, 0) != 0) continue;
    keep.push_back(TensorOf(**src, name));
    const bool target = name == std::string(kLayer) + "." + suffix;
    tensors.push_back({name, target ? dtype : entry.dtype, entry.shape, keep.back()});
  }
  const fs::path dir = testing::MakeConfigDir(CaseConfig(case_name));
  EXPECT_TRUE(safetensors::WriteFile((dir / "model.safetensors").string(), tensors).ok());
  return dir;
}

TEST(CompressedTensorsFp8CheckpointTest, WeightNotF8E4m3IsInvalidArgument) {
  const fs::path dir = CheckpointWith("ct_fp8_tensor_fp32", "weight", "I8", {});
  const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  fs::remove_all(dir);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ckpt.status().message(),
              HasSubstr("tensor 'model.layers.0.mlp.down_proj.weight' (layer "
                        "'model.layers.0.mlp.down_proj'): field 'dtype' is I8, want F8_E4M3"));
}

// A static scheme's input_scale is no weight tensor: it stays a raw tensor beside the layer.
TEST(CompressedTensorsFp8CheckpointTest, InputScaleIsARawTensor) {
  const float input_scale = 0.25f;
  const std::string name = std::string(kLayer) + ".input_scale";
  const fs::path dir = CheckpointWith(
      "ct_fp8_tensor_fp32", "", "",
      {{name, "F32", {1}, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(&input_scale), 4)}});
  const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->layers().size(), 1u);
  const RawTensor* raw = (*ckpt)->FindRawTensor(name);
  ASSERT_NE(raw, nullptr);
  EXPECT_EQ(raw->dtype, "F32");
  EXPECT_EQ(raw->bytes, 4);
  EXPECT_EQ((*ckpt)->FindRawTensor(std::string(kLayer) + ".weight"), nullptr);
  EXPECT_EQ((*ckpt)->FindRawTensor(std::string(kLayer) + ".weight_scale"), nullptr);
  fs::remove_all(dir);
}

// A block-strategy checkpoint (no library vector exists; hand-made): block_structure [2, 4] over
// weight (5, 10) is a (3, 3) weight_scale grid with partial last block row and column; the layer
// carries R = 2, C = 4, and every element is fp32(weight) * s[n / 2][k / 4] (fp32 scales: one
// rounding), in both orientations.
TEST(CompressedTensorsFp8CheckpointTest, BlockStrategyLoadsItsGridAndDequantizes) {
  std::string config = EditedConfig("ct_fp8_tensor_fp32", "\"strategy\": \"tensor\"",
                                    "\"strategy\": \"block\", \"block_structure\": [2, 4]");
  std::vector<uint8_t> weight(50);
  for (size_t i = 0; i < weight.size(); ++i) {
    weight[i] = static_cast<uint8_t>(i * 37 % 251);
    if ((weight[i] & 0x7F) == 0x7F) weight[i] = 0x38;  // no NaN
  }
  std::vector<float> scale(9);
  for (size_t i = 0; i < scale.size(); ++i) scale[i] = (i % 2 == 0 ? 1.0f : -1.0f) / (3.0f + i);
  const fs::path dir = testing::MakeConfigDir(config);
  ASSERT_TRUE(safetensors::WriteFile(
                  (dir / "model.safetensors").string(),
                  {{std::string(kLayer) + ".weight", "F8_E4M3", {5, 10}, weight},
                   {std::string(kLayer) + ".weight_scale",
                    "F32",
                    {3, 3},
                    absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(scale.data()), 36)}})
                  .ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->config().strategy, "block");
  EXPECT_EQ((*ckpt)->config().block_rows, 2);
  EXPECT_EQ((*ckpt)->config().group_size, 4);
  const QuantizedLayer* layer = (*ckpt)->Find(kLayer);
  ASSERT_NE(layer, nullptr);
  EXPECT_EQ(layer->view.shape.scale_block_rows, 2);
  EXPECT_EQ(layer->view.shape.group_size, 4);
  std::vector<float> want(50);
  for (int n = 0; n < 5; ++n)
    for (int k = 0; k < 10; ++k)
      want[n * 10 + k] = Fp8E4m3BitsToFloat(weight[n * 10 + k]) * scale[(n / 2) * 3 + k / 4];
  std::vector<float> got(50);
  ASSERT_TRUE(DequantizeCpu(layer->view, DType::kF32, 0, 5, got.data(), 2).ok());
  EXPECT_EQ(got, want);
  QuantView kn = layer->view;
  kn.shape.orientation = Orientation::kKN;
  std::vector<float> got_kn(50);
  ASSERT_TRUE(DequantizeReference(kn, DType::kF32, 0, 10, got_kn.data()).ok());
  for (int n = 0; n < 5; ++n)
    for (int k = 0; k < 10; ++k) EXPECT_EQ(got_kn[k * 5 + n], want[n * 10 + k]) << n << " " << k;
  // The same tensors under block_structure [4, 4]: a (2, 3) grid is wanted, weight_scale named.
  ckpt->reset();  // close it before the config changes
  testing::WriteText(dir / "config.json",
                     EditedConfig("ct_fp8_tensor_fp32", "\"strategy\": \"tensor\"",
                                  "\"strategy\": \"block\", \"block_structure\": [4, 4]"));
  const absl::StatusOr<std::unique_ptr<Checkpoint>> wrong = Checkpoint::Open(dir.string());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(),
              HasSubstr("field 'shape' is (3, 3), want (ceil(N/R), ceil(K/C)) = (2, 3), "
                        "block_structure [R, C] = [4, 4] (strategy 'block' declared, weight (N, K) "
                        "= (5, 10))"));
  fs::remove_all(dir);
}

// ---- Inline requests ---------------------------------------------------------------------------

// An inline layer carries K, N, G and the scale dtype only: scale_block_rows 0 (one scale row per
// weight row), so group_size -1 (= K) is the channel grid; the channel case's tensors by role
// dequantize to the library's bytes.
TEST(CompressedTensorsFp8InlineTest, ChannelByRoleDequantizesToTheVectors) {
  namespace v1 = ::dequant::v1;
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
      safetensors::MappedFile::Open(CaseFile("ct_fp8_channel_bf16").string());
  ASSERT_TRUE(file.ok());
  v1::InlinePackedTensor packed;
  packed.set_format("compressed_tensors_fp8");
  packed.set_in_features(128);
  packed.set_out_features(64);
  packed.set_group_size(-1);
  packed.set_scale_dtype(v1::DTYPE_BF16);
  for (const char* role : {"weight", "weight_scale"}) {
    const std::vector<uint8_t> bytes = TensorOf(**file, std::string(kLayer) + "." + role);
    v1::RoleBytes* t = packed.add_tensors();
    t->set_role(role);
    t->set_data(std::string(bytes.begin(), bytes.end()));
  }
  absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(packed, int64_t{1} << 30);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  const QuantShape& shape = tensor->view().shape;
  EXPECT_EQ(shape.format, Format::kCompressedTensorsFp8);
  EXPECT_EQ(shape.orientation, Orientation::kNK);
  EXPECT_EQ(shape.group_size, 128);
  EXPECT_EQ(shape.scale_block_rows, 0);
  for (DType out : kOutDtypes) {
    const std::vector<uint8_t> expected = TensorOf(**file, ExpectedName(out));
    std::vector<uint8_t> got(expected.size());
    ASSERT_TRUE(DequantizeCpu(tensor->view(), out, 0, 64, got.data()).ok());
    EXPECT_EQ(got, expected) << DTypeName(out);
  }
  // weight_scale bytes of another grid: named with the size wanted.
  packed.mutable_tensors(1)->mutable_data()->resize(2);
  const absl::StatusOr<InlineTensor> bad = InlineTensor::FromProto(packed, int64_t{1} << 30);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("packed.weight_scale has 2 bytes, expected 128 (64 * 1 * 2 (bf16))"));
}

// ---- Served end to end -------------------------------------------------------------------------

// A float-quantized checkpoint on the CPU backend: ListTensors names the format, its own
// orientation (NK) and its two stored tensors; DequantizeLayers with no orientation delivers the
// library's (N, K) bytes with an NK header; Dequantize with ORIENTATION_KN their transpose.
TEST(CompressedTensorsFp8ServedTest, ListAndDequantizeInTheFormatsOwnOrientationAndTheOther) {
  const char* name = "ct_fp8_channel_bf16";
  const fs::path dir = MakeCheckpoint(CaseConfig(name), CaseFile(name));
  ServerOptions options;
  options.model_dir = dir.string();
  absl::StatusOr<testing::CpuTestServer> server = testing::StartCpuTestServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  namespace v1 = ::dequant::v1;
  grpc::ClientContext list_context;
  v1::ListTensorsResponse list;
  ASSERT_TRUE(server->stub->ListTensors(&list_context, {}, &list).ok());
  ASSERT_EQ(list.tensors_size(), 1);
  const v1::QuantizedTensorInfo& info = list.tensors(0);
  EXPECT_EQ(info.name(), kLayer);
  EXPECT_EQ(info.format(), "compressed_tensors_fp8");
  EXPECT_EQ(info.orientation(), v1::ORIENTATION_NK);
  EXPECT_EQ(info.in_features(), 128);
  EXPECT_EQ(info.out_features(), 64);
  EXPECT_EQ(info.group_size(), 128);
  EXPECT_EQ(info.scale_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(info.packed_bytes(), 64 * 128 + 64 * 2);  // weight E4M3 + weight_scale (64, 1) bf16
  ASSERT_EQ(info.stored_tensors_size(), 2);
  EXPECT_EQ(info.stored_tensors(0).role(), "weight");
  EXPECT_EQ(info.stored_tensors(0).dtype(), v1::DTYPE_FP8_E4M3);
  EXPECT_THAT(info.stored_tensors(0).shape(), ::testing::ElementsAre(64, 128));
  EXPECT_EQ(info.stored_tensors(1).role(), "weight_scale");
  EXPECT_THAT(info.stored_tensors(1).shape(), ::testing::ElementsAre(64, 1));

  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(CaseFile(name).string());
  ASSERT_TRUE(vectors.ok());
  for (auto [dtype, out] :
       {std::pair{v1::DTYPE_BF16, DType::kBF16}, std::pair{v1::DTYPE_FP32, DType::kF32}}) {
    const std::vector<uint8_t> nk = TensorOf(**vectors, ExpectedName(out));
    v1::DequantizeLayersRequest layers;
    layers.set_output_dtype(dtype);
    grpc::ClientContext layers_context;
    auto layers_reader = server->stub->DequantizeLayers(&layers_context, layers);
    const testing::ReadStream all = testing::ReadAll(layers_reader);
    ASSERT_TRUE(all.status.ok()) << all.status.error_message();
    EXPECT_EQ(all.header.orientation(), v1::ORIENTATION_NK);
    EXPECT_THAT(all.header.shape(), ::testing::ElementsAre(64, 128));
    EXPECT_TRUE(all.bytes == nk);

    v1::DequantizeRequest one;
    one.set_tensor(kLayer);
    one.set_output_dtype(dtype);
    one.set_orientation(v1::ORIENTATION_KN);
    grpc::ClientContext one_context;
    auto one_reader = server->stub->Dequantize(&one_context, one);
    const testing::ReadStream kn = testing::ReadAll(one_reader);
    ASSERT_TRUE(kn.status.ok()) << kn.status.error_message();
    EXPECT_EQ(kn.header.orientation(), v1::ORIENTATION_KN);
    EXPECT_THAT(kn.header.shape(), ::testing::ElementsAre(128, 64));
    EXPECT_TRUE(kn.bytes == TransposeNk(nk, 64, 128, DTypeSize(out)));
  }
  server->server.reset();
  fs::remove_all(dir);
}

#if DEQUANTD_HAVE_CUDA
// Both float-quantized cases on the CUDA backend (resident layers; the format's fastest variant,
// v4_vec16): the library's bytes in (N, K) and their transpose in (K, N), fp16, bf16 and fp32.
// GPU only.
TEST_P(CompressedTensorsFp8VectorsTest, CudaBackendDequantizesBitExactToCompressedTensors) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Case& c = GetParam();
  const fs::path dir = MakeCheckpoint(CaseConfig(c.name), CaseFile(c.name));
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(CudaBackendOptions{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  ASSERT_TRUE((*backend)->Prepare(**ckpt).ok());
  const QuantizedLayer* layer = (*ckpt)->Find(kLayer);
  ASSERT_NE(layer, nullptr);
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(CaseFile(c.name).string());
  ASSERT_TRUE(vectors.ok());
  const int64_t K = layer->view.shape.K;
  const int64_t N = layer->view.shape.N;
  for (DType out : kOutDtypes) {
    SCOPED_TRACE(std::string(DTypeName(out)));
    const std::vector<uint8_t> nk = TensorOf(**vectors, ExpectedName(out));
    DequantSource source;
    source.layer = layer;
    source.orientation = Orientation::kNK;
    testing::BytesSink sink;
    ASSERT_TRUE((*backend)->Dequantize(source, out, 1 << 20, sink).ok());
    EXPECT_THAT(sink.kernel, HasSubstr("v4_vec16"));
    EXPECT_TRUE(sink.bytes == nk);
    source.orientation = Orientation::kKN;
    testing::BytesSink kn_sink;
    ASSERT_TRUE((*backend)->Dequantize(source, out, 1 << 20, kn_sink).ok());
    EXPECT_TRUE(kn_sink.bytes == TransposeNk(nk, N, K, DTypeSize(out)));
  }
  backend->reset();
  fs::remove_all(dir);
}
#endif  // DEQUANTD_HAVE_CUDA

}  // namespace
}  // namespace dequantd
