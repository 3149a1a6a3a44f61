// FP8 block-scaled against DeepSeek-V3's own weight_dequant: every case of
// tests/data/formats/fp8_block/ (made by tools/format_vectors/make_vectors.py, checked against the
// Triton kernel on an H200; docs/formats/fp8_block.md) is opened as a checkpoint (its config.json
// and its safetensors file as model.safetensors: detection from config.json through the registry,
// the shape from the stored tensors), and its layer is dequantized by the CPU reference and the CPU
// path in both orientations into fp16, bf16 and fp32, compared bit for bit with the reference's
// expected.<dtype> ((N, K)). Also the refusals an fp8 checkpoint or inline request can earn, with
// their exact codes and messages, a served checkpoint end to end on the CPU backend, and (GPU
// only) the CUDA backend on every case.
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/dequant.h"
#include "kernels/fp8_block_format.h"
#include "server/backend/backend.h"
#include "server/model/checkpoint.h"
#include "server/rpc/request.h"
#if DEQUANTD_HAVE_CUDA
#include "server/backend/cuda/cuda_backend.h"
#endif
#include "tests/server/cpu_test_server.h"

namespace dequantd {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::dequant::v1;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kLayer[] = "model.layers.0.mlp.down_proj";
constexpr char kWeight[] = "model.layers.0.mlp.down_proj.weight";
constexpr char kScale[] = "model.layers.0.mlp.down_proj.weight_scale_inv";

fs::path VectorDir() { return fs::path(DEQUANTD_SOURCE_DIR) / "tests/data/formats/fp8_block"; }

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string CaseConfig(const std::string& name) {
  return ReadText(VectorDir() / (name + ".config.json"));
}

fs::path TempDir() {
  std::string templ = ::testing::TempDir() + "/fp8_block_vectors.XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) return {};
  return fs::path(templ);
}

// A checkpoint directory holding `config` as config.json and a copy of `safetensors`.
fs::path MakeCheckpoint(const std::string& config, const fs::path& safetensors) {
  const fs::path dir = TempDir();
  if (dir.empty()) return dir;
  WriteText(dir / "config.json", config);
  fs::copy_file(safetensors, dir / "model.safetensors");
  return dir;
}

std::vector<uint8_t> TensorOf(const safetensors::MappedFile& file, const std::string& name) {
  absl::StatusOr<absl::Span<const uint8_t>> bytes = file.TensorBytes(name);
  EXPECT_TRUE(bytes.ok()) << name << ": " << bytes.status();
  if (!bytes.ok()) return {};
  return std::vector<uint8_t>(bytes->begin(), bytes->end());
}

// One tensor to write into an edited checkpoint.
struct EditableTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// A checkpoint made of case `name`'s tensors (the layer's, not the expected results) after `edit`,
// with `config` as config.json.
fs::path EditedCheckpoint(const std::string& name, const std::string& config,
                          const std::function<void(std::vector<EditableTensor>&)>& edit) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> src =
      safetensors::MappedFile::Open((VectorDir() / (name + ".safetensors")).string());
  EXPECT_TRUE(src.ok()) << src.status();
  if (!src.ok()) return {};
  std::vector<EditableTensor> tensors;
  for (const auto& [tensor, entry] : (*src)->header().tensors) {
    if (tensor.rfind(kLayer, 0) != 0) continue;
    tensors.push_back({tensor, entry.dtype, entry.shape, TensorOf(**src, tensor)});
  }
  edit(tensors);
  std::vector<safetensors::TensorToWrite> out;
  for (const EditableTensor& t : tensors) out.push_back({t.name, t.dtype, t.shape, t.bytes});
  const fs::path dir = TempDir();
  if (dir.empty()) return dir;
  WriteText(dir / "config.json", config);
  EXPECT_TRUE(safetensors::WriteFile((dir / "model.safetensors").string(), out).ok());
  return dir;
}

EditableTensor* Find(std::vector<EditableTensor>& tensors, const std::string& name) {
  for (EditableTensor& t : tensors)
    if (t.name == name) return &t;
  ADD_FAILURE() << name << " not in the case";
  static EditableTensor none;
  return &none;
}

absl::Status OpenStatus(const fs::path& dir) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  fs::remove_all(dir);
  return ckpt.status();
}

// A case's config.json with `from` replaced by `to`.
std::string EditedConfig(const std::string& name, const std::string& from, const std::string& to) {
  std::string text = CaseConfig(name);
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// (N, K) bytes transposed to (K, N), element size `elem`.
std::vector<uint8_t> Transposed(const std::vector<uint8_t>& nk, int64_t N, int64_t K,
                                int64_t elem) {
  std::vector<uint8_t> kn(nk.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      std::memcpy(kn.data() + (k * N + n) * elem, nk.data() + (n * K + k) * elem,
                  static_cast<size_t>(elem));
  return kn;
}

struct Case {
  const char* name;
  DType scale_dtype;
  int64_t N;
  int64_t K;
  uint32_t flags;  // fp8_block::kScaleUe8m0 when the config declares scale_fmt ue8m0
};

// docs/formats/fp8_block.md "Cases".
constexpr Case kCases[] = {
    {"fp8_block_scalef32_136x144", DType::kF32, 136, 144, 0},
    {"fp8_block_scalebf16_136x144", DType::kBF16, 136, 144, 0},
    {"fp8_block_scalef16_136x144", DType::kF16, 136, 144, 0},
    {"fp8_block_ue8m0_144x128", DType::kF32, 144, 128, fp8_block::kScaleUe8m0},
};

constexpr DType kOutDtypes[] = {DType::kF16, DType::kBF16, DType::kF32};

std::string ExpectedName(DType out) {
  return std::string("expected.") + std::string(DTypeName(out));
}

class Fp8BlockVectorsTest : public ::testing::TestWithParam<Case> {};

// Every CPU path, both orientations, every output dtype, against DeepSeek's bytes.
TEST_P(Fp8BlockVectorsTest, CheckpointDequantizesBitExactToDeepSeek) {
  const Case& c = GetParam();
  const fs::path file = VectorDir() / (std::string(c.name) + ".safetensors");
  const fs::path dir = MakeCheckpoint(CaseConfig(c.name), file);
  ASSERT_FALSE(dir.empty());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->config().format, Format::kFp8Block);
  const QuantizedLayer* layer = (*ckpt)->Find(kLayer);
  ASSERT_NE(layer, nullptr);
  ASSERT_EQ((*ckpt)->layers().size(), 1u);
  const QuantShape& shape = layer->view.shape;
  EXPECT_EQ(shape.format, Format::kFp8Block);
  EXPECT_EQ(shape.N, c.N);
  EXPECT_EQ(shape.K, c.K);
  EXPECT_EQ(shape.group_size, 128);
  EXPECT_EQ(shape.bits, 8);
  EXPECT_EQ(shape.scale_dtype, c.scale_dtype);
  EXPECT_EQ(shape.format_flags, c.flags);
  EXPECT_EQ(shape.orientation, Orientation::kNK);  // the format's own
  const TensorSpec scale = TensorSpecOf(shape, fp8_block::kWeightScaleInv);
  EXPECT_EQ(scale.rows, (c.N + 127) / 128);
  EXPECT_EQ(scale.cols, (c.K + 127) / 128);
  EXPECT_EQ(TensorSpecOf(shape, fp8_block::kWeight).bytes(), c.N * c.K);
  const int64_t K = shape.K;
  const int64_t N = shape.N;

  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(file.string());
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
      std::vector<uint8_t> fast(expected.size(), 0xA5);
      const cpu::CpuDequantOptions options{.threads = threads, .min_elements_per_thread = 1};
      ASSERT_TRUE(cpu::DequantizeCpuWithOptions(nk, out, 0, N, fast.data(), options).ok());
      EXPECT_EQ(fast, expected) << "cpu (N, K), threads " << threads;
      // Rows [5, 131) alone: across the block-row boundary at 128.
      std::vector<uint8_t> part(static_cast<size_t>(126 * K * elem), 0xA5);
      ASSERT_TRUE(cpu::DequantizeCpuWithOptions(nk, out, 5, 131, part.data(), options).ok());
      EXPECT_EQ(0, std::memcmp(part.data(), expected.data() + 5 * K * elem, part.size()));
    }

    QuantView kn = layer->view;  // (K, N): w_kn[k][n] = w_nk[n][k]
    kn.shape.orientation = Orientation::kKN;
    const std::vector<uint8_t> want_kn = Transposed(expected, N, K, elem);
    std::vector<uint8_t> got_kn(expected.size(), 0xA5);
    ASSERT_TRUE(DequantizeReference(kn, out, 0, K, got_kn.data()).ok());
    EXPECT_EQ(got_kn, want_kn) << "reference (K, N)";
    for (int threads : {1, 3}) {
      std::vector<uint8_t> fast(expected.size(), 0xA5);
      const cpu::CpuDequantOptions options{.threads = threads, .min_elements_per_thread = 1};
      ASSERT_TRUE(cpu::DequantizeCpuWithOptions(kn, out, 0, K, fast.data(), options).ok());
      EXPECT_EQ(fast, want_kn) << "cpu (K, N), threads " << threads;
      // Rows k [70, min(129, K)): a range that starts inside a 64-row tile and (K = 144)
      // crosses a block column.
      const int64_t k_end = std::min<int64_t>(129, K);
      std::vector<uint8_t> part(static_cast<size_t>((k_end - 70) * N * elem), 0xA5);
      ASSERT_TRUE(cpu::DequantizeCpuWithOptions(kn, out, 70, k_end, part.data(), options).ok());
      EXPECT_EQ(0, std::memcmp(part.data(), want_kn.data() + 70 * N * elem, part.size()));
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8BlockVectorsTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

// The cases' special values, checked on the bytes themselves (so the comparisons above cover
// them): fp16 overflow to inf where a block's scale is 256 (scalef32 block (1, 1)), and the
// E4M3 edge bytes of row 0 (+-0, the smallest subnormals, +-448).
TEST(Fp8BlockFormatTest, E4m3ConversionIsExactOnEveryByte) {
  EXPECT_EQ(FloatBits(Fp8E4m3BitsToFloat(0x00)), 0u);
  EXPECT_EQ(FloatBits(Fp8E4m3BitsToFloat(0x80)), 0x80000000u);  // -0
  EXPECT_EQ(Fp8E4m3BitsToFloat(0x01), 0.001953125f);            // 2^-9, smallest subnormal
  EXPECT_EQ(Fp8E4m3BitsToFloat(0x07), 7 * 0.001953125f);        // largest subnormal
  EXPECT_EQ(Fp8E4m3BitsToFloat(0x08), 0.015625f);               // 2^-6, smallest normal
  EXPECT_EQ(Fp8E4m3BitsToFloat(0x38), 1.0f);
  EXPECT_EQ(Fp8E4m3BitsToFloat(0x7E), 448.0f);  // largest finite
  EXPECT_EQ(Fp8E4m3BitsToFloat(0xFE), -448.0f);
  EXPECT_NE(Fp8E4m3BitsToFloat(0x7F), Fp8E4m3BitsToFloat(0x7F));  // NaN
  EXPECT_NE(Fp8E4m3BitsToFloat(0xFF), Fp8E4m3BitsToFloat(0xFF));  // NaN
  // Every finite byte: (1 + m/8) * 2^(e-7), or m * 2^-9 for e = 0, independently computed.
  for (int b = 0; b < 256; ++b) {
    const int e = (b >> 3) & 15;
    const int m = b & 7;
    if (e == 15 && m == 7) continue;
    double v = e == 0 ? m / 512.0 : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
    if (b & 0x80) v = -v;
    EXPECT_EQ(static_cast<double>(Fp8E4m3BitsToFloat(static_cast<uint8_t>(b))), v) << b;
  }
}

TEST(Fp8BlockFormatTest, VectorsHoldTheirSpecialValues) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> f32 = safetensors::MappedFile::Open(
      (VectorDir() / "fp8_block_scalef32_136x144.safetensors").string());
  ASSERT_TRUE(f32.ok());
  const std::vector<uint8_t> scale = TensorOf(**f32, kScale);
  float s11 = 0;
  std::memcpy(&s11, scale.data() + 3 * 4, 4);
  EXPECT_EQ(s11, 256.0f);
  const std::vector<uint8_t> fp16 = TensorOf(**f32, "expected.fp16");
  int infs = 0;
  for (size_t i = 0; i < fp16.size(); i += 2) {
    const uint16_t h = static_cast<uint16_t>(fp16[i] | fp16[i + 1] << 8);
    infs += (h & 0x7FFF) == 0x7C00;
  }
  EXPECT_GT(infs, 0);
  const std::vector<uint8_t> weight = TensorOf(**f32, kWeight);
  EXPECT_THAT(std::vector<uint8_t>(weight.begin(), weight.begin() + 2), ElementsAre(0x00, 0x80));
}

// ---- Refusals ----------------------------------------------------------------------------------

constexpr char kF32Case[] = "fp8_block_scalef32_136x144";

TEST(Fp8BlockCheckpointTest, ScaleGridThatDoesNotCoverTheWeightIsInvalidArgument) {
  const absl::Status s = OpenStatus(
      EditedCheckpoint(kF32Case, CaseConfig(kF32Case), [](std::vector<EditableTensor>& t) {
        EditableTensor* scale = Find(t, kScale);
        scale->shape = {1, 2};  // one block row for 136 rows
        scale->bytes.resize(8);
      }));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor 'model.layers.0.mlp.down_proj.weight_scale_inv' (layer "
                        "'model.layers.0.mlp.down_proj'): field 'shape' is (1, 2), want "
                        "(ceil(N/128), ceil(K/128)) = (2, 2) for weight (N, K) = (136, 144): the "
                        "scale grid must cover the weight in 128x128 blocks"));
}

// transformers derives the block from the grid: a grid of 3 x 2 over 136 x 144 is not 128x128.
TEST(Fp8BlockCheckpointTest, ScaleGridOfAnotherBlockSizeIsInvalidArgument) {
  const absl::Status s = OpenStatus(
      EditedCheckpoint(kF32Case, CaseConfig(kF32Case), [](std::vector<EditableTensor>& t) {
        EditableTensor* scale = Find(t, kScale);
        scale->shape = {3, 3};  // 64x64 blocks
        scale->bytes.resize(36);
      }));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("field 'shape' is (3, 3), want (ceil(N/128), ceil(K/128)) = "
                                     "(2, 2)"));
}

TEST(Fp8BlockCheckpointTest, WrongScaleDtypeIsInvalidArgument) {
  const absl::Status s = OpenStatus(
      EditedCheckpoint(kF32Case, CaseConfig(kF32Case),
                       [](std::vector<EditableTensor>& t) { Find(t, kScale)->dtype = "I32"; }));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor 'model.layers.0.mlp.down_proj.weight_scale_inv' (layer "
                        "'model.layers.0.mlp.down_proj'): field 'dtype' is I32, want F32, BF16 "
                        "or F16"));
}

TEST(Fp8BlockCheckpointTest, E5m2WeightIsInvalidArgument) {
  const absl::Status s = OpenStatus(EditedCheckpoint(
      kF32Case, CaseConfig(kF32Case),
      [](std::vector<EditableTensor>& t) { Find(t, kWeight)->dtype = "F8_E5M2"; }));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'model.layers.0.mlp.down_proj.weight' (layer "
                                     "'model.layers.0.mlp.down_proj'): field 'dtype' is F8_E5M2, "
                                     "want F8_E4M3"));
}

TEST(Fp8BlockCheckpointTest, ThreeDimScaleIsInvalidArgument) {
  const absl::Status s = OpenStatus(
      EditedCheckpoint(kF32Case, CaseConfig(kF32Case), [](std::vector<EditableTensor>& t) {
        Find(t, kScale)->shape = {1, 2, 2};
      }));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("weight_scale_inv' (layer 'model.layers.0.mlp.down_proj'): field 'shape' "
                        "has 3 dims, want 2"));
}

TEST(Fp8BlockCheckpointTest, ScaleWithoutWeightIsFailedPrecondition) {
  const absl::Status s = OpenStatus(
      EditedCheckpoint(kF32Case, CaseConfig(kF32Case), [](std::vector<EditableTensor>& t) {
        std::erase_if(t, [](const EditableTensor& e) { return e.name == kWeight; });
      }));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr(": tensor 'model.layers.0.mlp.down_proj.weight_scale_inv' (layer "
                        "'model.layers.0.mlp.down_proj', format fp8_block): the layer has no "
                        "weight tensor: 'model.layers.0.mlp.down_proj.weight' is missing"));
}

absl::Status OpenWithConfig(const std::string& config) {
  return OpenStatus(MakeCheckpoint(config, VectorDir() / (std::string(kF32Case) + ".safetensors")));
}

TEST(Fp8BlockCheckpointTest, BlockSizeOtherThan128x128IsInvalidArgument) {
  const absl::Status s = OpenWithConfig(EditedConfig(kF32Case, "128,\n      128", "64,\n      64"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("quantization_config field 'weight_block_size' is [64, 64], "
                                     "only [128, 128] is served"));
}

TEST(Fp8BlockCheckpointTest, MissingBlockSizeIsInvalidArgument) {
  const absl::Status s = OpenWithConfig(
      "{\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
      "\"activation_scheme\": \"dynamic\"}}");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("quantization_config field 'weight_block_size' is missing; only "
                        "block-scaled FP8 (weight_block_size [128, 128], DeepSeek-V3 style) is "
                        "served"));
}

TEST(Fp8BlockCheckpointTest, BlockSizeThatIsNotAListIsInvalidArgument) {
  const absl::Status s = OpenWithConfig(
      "{\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": 128}}");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("quantization_config field 'weight_block_size' is not a list of integers"));
}

TEST(Fp8BlockCheckpointTest, FmtOtherThanE4m3IsInvalidArgument) {
  const absl::Status s =
      OpenWithConfig(EditedConfig(kF32Case, "\"fmt\": \"e4m3\"", "\"fmt\": \"e5m2\""));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("quantization_config field 'fmt' is 'e5m2', only 'e4m3' is served"));
}

TEST(Fp8BlockCheckpointTest, UnknownScaleFmtIsInvalidArgument) {
  const absl::Status s = OpenWithConfig(
      EditedConfig(kF32Case, "\"fmt\": \"e4m3\"", "\"fmt\": \"e4m3\", \"scale_fmt\": \"e4m3\""));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("quantization_config field 'scale_fmt' is 'e4m3', only "
                                     "'ue8m0' (or no scale_fmt) is served"));
}

// ---- Inline requests ---------------------------------------------------------------------------

v1::InlinePackedTensor InlineOf(const safetensors::MappedFile& file, int64_t N, int64_t K,
                                v1::DType scale_dtype) {
  v1::InlinePackedTensor packed;
  packed.set_format("fp8_block");
  packed.set_in_features(K);
  packed.set_out_features(N);
  packed.set_group_size(128);
  packed.set_scale_dtype(scale_dtype);
  for (const char* role : {"weight", "weight_scale_inv"}) {
    const std::vector<uint8_t> bytes = TensorOf(file, std::string(kLayer) + "." + role);
    v1::RoleBytes* t = packed.add_tensors();
    t->set_role(role);
    t->set_data(std::string(bytes.begin(), bytes.end()));
  }
  return packed;
}

TEST(Fp8BlockInlineTest, ByRoleHasItsShapeAndDequantizesToTheVectors) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file = safetensors::MappedFile::Open(
      (VectorDir() / "fp8_block_scalebf16_136x144.safetensors").string());
  ASSERT_TRUE(file.ok());
  const v1::InlinePackedTensor packed = InlineOf(**file, 136, 144, v1::DTYPE_BF16);
  absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(packed, int64_t{1} << 30);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  const QuantShape& shape = tensor->view().shape;
  EXPECT_EQ(shape.format, Format::kFp8Block);
  EXPECT_EQ(shape.orientation, Orientation::kNK);
  EXPECT_EQ(shape.scale_dtype, DType::kBF16);
  const std::vector<uint8_t> expected = TensorOf(**file, "expected.fp32");
  std::vector<uint8_t> got(expected.size());
  ASSERT_TRUE(DequantizeCpu(tensor->view(), DType::kF32, 0, 136, got.data()).ok());
  EXPECT_EQ(got, expected);
}

TEST(Fp8BlockInlineTest, ScaleBytesOfAnotherGridAreInvalidArgument) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file = safetensors::MappedFile::Open(
      (VectorDir() / "fp8_block_scalef32_136x144.safetensors").string());
  ASSERT_TRUE(file.ok());
  v1::InlinePackedTensor packed = InlineOf(**file, 136, 144, v1::DTYPE_FP32);
  packed.mutable_tensors(1)->mutable_data()->resize(8);
  const absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(packed, int64_t{1} << 30);
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tensor.status().message(),
              HasSubstr("packed.weight_scale_inv has 8 bytes, expected 16 (2 * 2 * 4 (fp32))"));
}

TEST(Fp8BlockInlineTest, GroupSizeOtherThan128IsInvalidArgument) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file = safetensors::MappedFile::Open(
      (VectorDir() / "fp8_block_scalef32_136x144.safetensors").string());
  ASSERT_TRUE(file.ok());
  v1::InlinePackedTensor packed = InlineOf(**file, 136, 144, v1::DTYPE_FP32);
  packed.set_group_size(64);
  const absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(packed, int64_t{1} << 30);
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tensor.status().message(),
              HasSubstr("packed: group_size must be 128 (the 128x128 scale block) for fp8_block, "
                        "got 64"));
}

// fp32 scales are fp8_block's; the other formats still refuse them, naming their own field.
TEST(Fp8BlockInlineTest, Fp32ScalesAreRefusedByAwq) {
  v1::InlinePackedTensor packed;
  packed.set_in_features(128);
  packed.set_out_features(8);
  packed.set_group_size(128);
  packed.set_scale_dtype(v1::DTYPE_FP32);
  packed.set_qweight(std::string(128 * 4, '\0'));
  packed.set_qzeros(std::string(4, '\0'));
  packed.set_scales(std::string(8 * 4, '\0'));
  const absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(packed, int64_t{1} << 30);
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tensor.status().message(),
              HasSubstr("packed.scale_dtype: scales dtype must be fp16 or bf16, got fp32"));
}

// ---- Served end to end (CPU backend) -----------------------------------------------------------

// Reads one streamed result: its header and bytes.
template <class Reader>
absl::Status ReadAll(Reader& reader, v1::DequantizeHeader* header, std::vector<uint8_t>* bytes) {
  v1::DequantizeResponse response;
  bytes->clear();
  while (reader->Read(&response)) {
    if (response.has_header()) *header = response.header();
    bytes->insert(bytes->end(), response.data().begin(), response.data().end());
  }
  const grpc::Status s = reader->Finish();
  return s.ok() ? absl::OkStatus()
                : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// An FP8 checkpoint with an unquantized `.weight` beside the layer (a norm, as DeepSeek's have),
// served on the CPU backend: ListTensors names the format, its orientation (NK), the shape, the
// block, the fp32 scale dtype and both stored tensors, and lists the norm as a raw tensor;
// GetServerInfo counts one layer; DequantizeLayers with no orientation delivers DeepSeek's (N, K)
// bf16 bytes with an NK header; Dequantize with ORIENTATION_KN delivers the fp16 transpose
// (inf included) with a KN header.
TEST(Fp8BlockServedTest, ListInfoAndDequantizeInTheFormatsOwnOrientationAndTheOther) {
  const std::vector<uint8_t> norm(144 * 2, 0x3F);
  const fs::path dir =
      EditedCheckpoint(kF32Case, CaseConfig(kF32Case), [&](std::vector<EditableTensor>& t) {
        t.push_back({"model.layers.0.post_attention_layernorm.weight", "BF16", {144}, norm});
      });
  ASSERT_FALSE(dir.empty());
  ServerOptions options;
  options.model_dir = dir.string();
  absl::StatusOr<testing::CpuTestServer> server = testing::StartCpuTestServer(options);
  ASSERT_TRUE(server.ok()) << server.status();

  grpc::ClientContext list_context;
  v1::ListTensorsResponse list;
  ASSERT_TRUE(server->stub->ListTensors(&list_context, {}, &list).ok());
  ASSERT_EQ(list.tensors_size(), 1);
  const v1::QuantizedTensorInfo& info = list.tensors(0);
  EXPECT_EQ(info.name(), kLayer);
  EXPECT_EQ(info.format(), "fp8_block");
  EXPECT_EQ(info.orientation(), v1::ORIENTATION_NK);
  EXPECT_EQ(info.in_features(), 144);
  EXPECT_EQ(info.out_features(), 136);
  EXPECT_EQ(info.group_size(), 128);
  EXPECT_EQ(info.scale_dtype(), v1::DTYPE_FP32);
  EXPECT_EQ(info.packed_bytes(), 136 * 144 + 2 * 2 * 4);
  ASSERT_EQ(info.stored_tensors_size(), 2);
  EXPECT_EQ(info.stored_tensors(0).role(), "weight");
  EXPECT_EQ(info.stored_tensors(0).dtype(), v1::DTYPE_FP8_E4M3);
  EXPECT_THAT(info.stored_tensors(0).shape(), ElementsAre(136, 144));
  EXPECT_EQ(info.stored_tensors(1).role(), "weight_scale_inv");
  EXPECT_EQ(info.stored_tensors(1).dtype(), v1::DTYPE_FP32);
  EXPECT_THAT(info.stored_tensors(1).shape(), ElementsAre(2, 2));
  ASSERT_EQ(list.other_tensors_size(), 1);
  EXPECT_EQ(list.other_tensors(0).name(), "model.layers.0.post_attention_layernorm.weight");

  grpc::ClientContext info_context;
  v1::GetServerInfoResponse server_info;
  ASSERT_TRUE(server->stub->GetServerInfo(&info_context, {}, &server_info).ok());
  EXPECT_EQ(server_info.tensor_count(), 1);
  EXPECT_THAT(server_info.model_config_json(), HasSubstr("\"quant_method\": \"fp8\""));

  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors = safetensors::MappedFile::Open(
      (VectorDir() / (std::string(kF32Case) + ".safetensors")).string());
  ASSERT_TRUE(vectors.ok());
  v1::DequantizeHeader header;
  std::vector<uint8_t> got;

  v1::DequantizeLayersRequest layers;
  layers.set_output_dtype(v1::DTYPE_BF16);
  grpc::ClientContext layers_context;
  auto layers_reader = server->stub->DequantizeLayers(&layers_context, layers);
  ASSERT_TRUE(ReadAll(layers_reader, &header, &got).ok());
  EXPECT_EQ(header.orientation(), v1::ORIENTATION_NK);
  EXPECT_THAT(header.shape(), ElementsAre(136, 144));
  EXPECT_TRUE(got == TensorOf(**vectors, "expected.bf16"));

  v1::DequantizeRequest one;
  one.set_tensor(kLayer);
  one.set_output_dtype(v1::DTYPE_FP16);
  one.set_orientation(v1::ORIENTATION_KN);
  grpc::ClientContext one_context;
  auto one_reader = server->stub->Dequantize(&one_context, one);
  ASSERT_TRUE(ReadAll(one_reader, &header, &got).ok());
  EXPECT_EQ(header.orientation(), v1::ORIENTATION_KN);
  EXPECT_THAT(header.shape(), ElementsAre(144, 136));
  EXPECT_TRUE(got == Transposed(TensorOf(**vectors, "expected.fp16"), 136, 144, 2));
  server->server.reset();
  fs::remove_all(dir);
}

#if DEQUANTD_HAVE_CUDA
// Collects one streamed result.
class BytesSink : public ChunkSink {
 public:
  absl::Status Begin(const std::string& k) override {
    kernel = k;
    return absl::OkStatus();
  }
  absl::Status Write(int64_t, absl::Span<const uint8_t> data) override {
    bytes.insert(bytes.end(), data.begin(), data.end());
    return absl::OkStatus();
  }
  std::string kernel;
  std::vector<uint8_t> bytes;
};

// Every fp8_block case on the CUDA backend (resident layers), with each of its variants (v4_vec16,
// the configured default: (N, K) by 16-byte vectors, (K, N) by transpose tiles; v1_per_element):
// Dequantize in the format's own orientation gives DeepSeek's bytes, and in (K, N) their
// transpose, for fp16, bf16 and fp32. GPU only.
TEST_P(Fp8BlockVectorsTest, CudaBackendDequantizesBitExactToDeepSeek) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Case& c = GetParam();
  const fs::path file = VectorDir() / (std::string(c.name) + ".safetensors");
  const fs::path dir = MakeCheckpoint(CaseConfig(c.name), file);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(file.string());
  ASSERT_TRUE(vectors.ok());
  for (cuda::KernelVariant variant :
       {cuda::KernelVariant::kV4Vec16, cuda::KernelVariant::kV1PerElement}) {
    SCOPED_TRACE(std::string(cuda::VariantName(variant)));
    CudaBackendOptions backend_options;
    backend_options.variant = variant;
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(backend_options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    ASSERT_TRUE((*backend)->Prepare(**ckpt).ok());
    const QuantizedLayer* layer = (*ckpt)->Find(kLayer);
    ASSERT_NE(layer, nullptr);
    for (DType out : kOutDtypes) {
      SCOPED_TRACE(std::string(DTypeName(out)));
      const std::vector<uint8_t> nk = TensorOf(**vectors, ExpectedName(out));
      DequantSource source;
      source.layer = layer;
      source.orientation = Orientation::kNK;
      BytesSink sink;
      ASSERT_TRUE((*backend)->Dequantize(source, out, 1 << 20, sink).ok());
      EXPECT_THAT(sink.kernel, HasSubstr(std::string(cuda::VariantName(variant))));
      EXPECT_TRUE(sink.bytes == nk);
      source.orientation = Orientation::kKN;
      BytesSink kn_sink;
      ASSERT_TRUE((*backend)->Dequantize(source, out, 1 << 20, kn_sink).ok());
      EXPECT_TRUE(kn_sink.bytes == Transposed(nk, c.N, c.K, DTypeSize(out)));
    }
    backend->reset();
  }
  fs::remove_all(dir);
}
#endif  // DEQUANTD_HAVE_CUDA

}  // namespace
}  // namespace dequantd
