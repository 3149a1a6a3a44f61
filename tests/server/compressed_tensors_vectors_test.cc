// compressed-tensors against the library's own results: every pack-quantized case of
// tests/data/formats/compressed_tensors/ (made by tools/format_vectors/make_vectors.py with
// compressed-tensors 0.20.0's compressor, 0.18.0 for actorder group) is opened as a checkpoint
// (its config.json and its safetensors file as model.safetensors: detection from config.json
// through the registry, the shape from the stored tensors, the stored-value checks), and its layer
// is dequantized by the CPU reference and the CPU path in both orientations into fp16, bf16 and
// fp32, compared bit for bit with the library's expected.<dtype> ((N, K)). Also the refusals a
// compressed-tensors checkpoint can earn, with their exact codes and messages, a checkpoint served
// end to end on the CPU backend, and (GPU only) the CUDA backend on every case.
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
#include "kernels/compressed_tensors_format.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/dequant.h"
#include "server/backend/backend.h"
#include "server/model/checkpoint.h"
#if DEQUANTD_HAVE_CUDA
#include "server/backend/cuda/cuda_backend.h"
#endif
#include "tests/server/cpu_test_server.h"
#include "tests/server/format_vectors.h"

namespace dequantd {
namespace {

namespace fs = std::filesystem;
namespace ct = compressed_tensors;
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
  int bits;
  int64_t group_size;  // as the shape holds it (channel: K)
  uint32_t flags;      // ct::kSym / kNoGidx the shape must carry
  DType scale_dtype;
  int64_t N;
  int64_t K;
};

// docs/formats/compressed_tensors.md "Cases" (the pack-quantized ones).
constexpr Case kCases[] = {
    {"ct_int4_g32_sym_bf16", 4, 32, ct::kSym | ct::kNoGidx, DType::kBF16, 64, 128},
    {"ct_int4_g64_asym_bf16", 4, 64, ct::kNoGidx, DType::kBF16, 64, 256},
    {"ct_int4_g128_sym_fp16", 4, 128, ct::kSym | ct::kNoGidx, DType::kF16, 64, 256},
    {"ct_int4_g32_asym_fp32", 4, 32, ct::kNoGidx, DType::kF32, 40, 128},
    {"ct_int8_channel_sym_bf16", 8, 128, ct::kSym | ct::kNoGidx, DType::kBF16, 64, 128},
    {"ct_int8_channel_asym_bf16", 8, 128, ct::kNoGidx, DType::kBF16, 64, 128},
    {"ct_int4_g32_asym_actorder_bf16", 4, 32, 0, DType::kBF16, 64, 128},
};

constexpr DType kOutDtypes[] = {DType::kF16, DType::kBF16, DType::kF32};

std::string ExpectedName(DType out) {
  return std::string("expected.") + std::string(DTypeName(out));
}

class CompressedTensorsVectorsTest : public ::testing::TestWithParam<Case> {};

// Every path, both orientations, every output dtype, against compressed-tensors' bytes.
TEST_P(CompressedTensorsVectorsTest, CheckpointDequantizesBitExactToCompressedTensors) {
  const Case& c = GetParam();
  const fs::path dir = MakeCheckpoint(CaseConfig(c.name), CaseFile(c.name));
  ASSERT_FALSE(dir.empty());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->config().format, Format::kCompressedTensors);
  ASSERT_EQ((*ckpt)->layers().size(), 1u);
  const QuantizedLayer* layer = (*ckpt)->Find(kLayer);
  ASSERT_NE(layer, nullptr);
  const QuantShape& shape = layer->view.shape;
  EXPECT_EQ(shape.format, Format::kCompressedTensors);
  EXPECT_EQ(shape.bits, c.bits);
  EXPECT_EQ(shape.group_size, c.group_size);
  EXPECT_EQ(shape.format_flags, c.flags);
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
      // Rows [5, 30) alone.
      std::vector<uint8_t> part(static_cast<size_t>(25 * K * elem), 0xA5);
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

INSTANTIATE_TEST_SUITE_P(Cases, CompressedTensorsVectorsTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

// A bf16-scaled case's fp32 result holds the bf16-rounded values (the library computes in the
// scale dtype, then casts): its every value is a bf16, and it differs from a single rounding of
// the exact product somewhere (so the double rounding is what the vectors pin).
TEST(CompressedTensorsRoundingTest, Fp32OfBf16ScalesIsTheBf16Result) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(CaseFile("ct_int4_g64_asym_bf16").string());
  ASSERT_TRUE(vectors.ok());
  const std::vector<uint8_t> f32 = TensorOf(**vectors, "expected.fp32");
  const std::vector<uint8_t> bf16 = TensorOf(**vectors, "expected.bf16");
  ASSERT_EQ(f32.size(), 2 * bf16.size());
  for (size_t i = 0; i < bf16.size() / 2; ++i) {
    uint32_t bits;
    std::memcpy(&bits, f32.data() + 4 * i, 4);
    uint16_t b;
    std::memcpy(&b, bf16.data() + 2 * i, 2);
    ASSERT_EQ(bits, static_cast<uint32_t>(b) << 16) << i;
  }
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

absl::Status OpenWith(const std::string& config, const char* case_name) {
  const fs::path dir = MakeCheckpoint(config, CaseFile(case_name));
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  fs::remove_all(dir);
  return ckpt.status();
}

// float-quantized is served by its own row (compressed_tensors_fp8_vectors_test.cc); the other
// compressed-tensors formats are refused naming what is served.
TEST(CompressedTensorsCheckpointTest, OtherFormatsAreInvalidArgument) {
  const absl::Status s =
      OpenWith(EditedConfig("ct_int4_g64_asym_bf16", "\"format\": \"pack-quantized\"",
                            "\"format\": \"marlin-24\""),
               "ct_int4_g64_asym_bf16");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("quantization_config field 'format' is 'marlin-24', only "
                                     "'pack-quantized' and 'float-quantized' are served"));
}

TEST(CompressedTensorsCheckpointTest, UnsupportedBitsNameTheFieldPath) {
  const absl::Status s =
      OpenWith(EditedConfig("ct_int4_g64_asym_bf16", "\"num_bits\": 4", "\"num_bits\": 3"),
               "ct_int4_g64_asym_bf16");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("quantization_config field 'config_groups/group_0/weights/num_bits' is 3, "
                        "only 4 and 8 are served"));
}

TEST(CompressedTensorsCheckpointTest, UnknownStrategyIsInvalidArgument) {
  const absl::Status s = OpenWith(
      EditedConfig("ct_int4_g64_asym_bf16", "\"strategy\": \"group\"", "\"strategy\": \"block\""),
      "ct_int4_g64_asym_bf16");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("field 'config_groups/group_0/weights/strategy' is 'block', only 'group', "
                        "'channel' and 'tensor' are served"));
}

TEST(CompressedTensorsCheckpointTest, FrozenStatusIsInvalidArgument) {
  const absl::Status s =
      OpenWith(EditedConfig("ct_int4_g64_asym_bf16", "\"quantization_status\": \"compressed\"",
                            "\"quantization_status\": \"frozen\""),
               "ct_int4_g64_asym_bf16");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("field 'quantization_status' is 'frozen', only 'compressed'"));
}

// Two groups with different weights schemes: one scheme per checkpoint.
TEST(CompressedTensorsCheckpointTest, MixedSchemesAreInvalidArgument) {
  const std::string config =
      R"({"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
          "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
                        "symmetric": true, "strategy": "group", "group_size": 32}},
            "group_1": {"targets": ["re:.*down_proj"], "weights": {"num_bits": 8, "type": "int",
                        "symmetric": true, "strategy": "channel"}}}}})";
  const absl::Status s = OpenWith(config, "ct_int4_g32_sym_bf16");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("field 'config_groups' has groups 'group_0' and 'group_1' "
                                     "that quantize weights differently (num_bits 4 vs 8); one "
                                     "weights scheme per checkpoint is served"));
}

// A declared group size whose grid the stored scales do not cover: weight_scale named.
TEST(CompressedTensorsCheckpointTest, ScaleShapeNotCoveringTheWeightNamesWeightScale) {
  const absl::Status s =
      OpenWith(EditedConfig("ct_int4_g64_asym_bf16", "\"group_size\": 64", "\"group_size\": 128"),
               "ct_int4_g64_asym_bf16");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor 'model.layers.0.mlp.down_proj.weight_scale' (layer "
                        "'model.layers.0.mlp.down_proj'): field 'shape' is (64, 4), want (N, K/G) "
                        "= (64, 2) (strategy 'group', K = 256, group_size 128)"));
}

// Declared asymmetric without stored zero points.
TEST(CompressedTensorsCheckpointTest, DeclaredAsymmetricWithoutZeroPointsIsInvalidArgument) {
  const absl::Status s =
      OpenWith(EditedConfig("ct_int4_g32_sym_bf16", "\"symmetric\": true", "\"symmetric\": false"),
               "ct_int4_g32_sym_bf16");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'model.layers.0.mlp.down_proj.weight_zero_point' is "
                                     "missing; symmetric is false, so zero points must be stored"));
}

// A safetensors copy of a case with tensor `suffix` of the layer dropped, or its bytes edited.
fs::path CheckpointWithTensor(const char* case_name, const std::string& config,
                              const std::string& suffix, bool drop,
                              const std::function<void(std::vector<uint8_t>&)>& edit) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> src =
      safetensors::MappedFile::Open(CaseFile(case_name).string());
  EXPECT_TRUE(src.ok());
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve((*src)->header().tensors.size());
  std::vector<safetensors::TensorToWrite> tensors;
  for (const auto& [name, entry] : (*src)->header().tensors) {
    if (name.rfind(kLayer, 0) != 0) continue;
    const bool target = name == std::string(kLayer) + "." + suffix;
    if (target && drop) continue;
    keep.push_back(TensorOf(**src, name));
    if (target && edit) edit(keep.back());
    tensors.push_back({name, entry.dtype, entry.shape, keep.back()});
  }
  const fs::path dir = testing::MakeConfigDir(config);
  EXPECT_TRUE(safetensors::WriteFile((dir / "model.safetensors").string(), tensors).ok());
  return dir;
}

absl::Status OpenEdited(const char* case_name, const std::string& suffix, bool drop,
                        const std::function<void(std::vector<uint8_t>&)>& edit) {
  const fs::path dir = CheckpointWithTensor(case_name, CaseConfig(case_name), suffix, drop, edit);
  const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  fs::remove_all(dir);
  return ckpt.status();
}

void SetI32(std::vector<uint8_t>& bytes, size_t i, int32_t v) { std::memcpy(&bytes[4 * i], &v, 4); }

TEST(CompressedTensorsCheckpointTest, WeightShapeThatDisagreesIsInvalidArgument) {
  const absl::Status s =
      OpenEdited("ct_int4_g64_asym_bf16", "weight_shape", false, [](std::vector<uint8_t>& b) {
        const int64_t k = 250;
        std::memcpy(&b[8], &k, 8);
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layer 'model.layers.0.mlp.down_proj': weight_shape is (64, "
                                     "250), want (N, K) = (64, 256)"));
}

TEST(CompressedTensorsCheckpointTest, GidxOutOfRangeIsInvalidArgumentNamingTheColumn) {
  const absl::Status s = OpenEdited("ct_int4_g32_asym_actorder_bf16", "weight_g_idx", false,
                                    [](std::vector<uint8_t>& b) { SetI32(b, 7, 4); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("layer 'model.layers.0.mlp.down_proj': weight_g_idx[7] is 4, want [0, 4) "
                        "(groups = K / group_size = 128 / 32)"));
}

// A g_idx whose groups do not each hold G columns: compressed-tensors' rank rule would group
// differently than g_idx says, so it is refused rather than served differently.
TEST(CompressedTensorsCheckpointTest, UnevenGidxGroupsAreFailedPrecondition) {
  const absl::Status s = OpenEdited("ct_int4_g32_asym_actorder_bf16", "weight_g_idx", false,
                                    [](std::vector<uint8_t>& b) {
                                      int32_t g7;
                                      std::memcpy(&g7, &b[4 * 7], 4);
                                      SetI32(b, 7, (g7 + 1) % 4);
                                    });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("weight_g_idx: group "));
  EXPECT_THAT(s.message(), HasSubstr("columns, want group_size = 32"));
}

TEST(CompressedTensorsCheckpointTest, MissingGidxWithActorderGroupIsInvalidArgument) {
  const absl::Status s = OpenEdited("ct_int4_g32_asym_actorder_bf16", "weight_g_idx", true, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'model.layers.0.mlp.down_proj.weight_g_idx' is "
                                     "missing; actorder is 'group'"));
}

TEST(CompressedTensorsCheckpointTest, MissingWeightShapeIsFailedPrecondition) {
  const absl::Status s = OpenEdited("ct_int4_g64_asym_bf16", "weight_shape", true, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("(layer 'model.layers.0.mlp.down_proj', format compressed_tensors): the "
                        "layer has no weight_shape tensor: "
                        "'model.layers.0.mlp.down_proj.weight_shape' is missing"));
}

// ---- Served end to end -------------------------------------------------------------------------

// A compressed-tensors checkpoint on the CPU backend: ListTensors names the format, its own
// orientation (NK) and its five stored tensors (weight_shape int64); GetServerInfo has the model;
// DequantizeLayers with no orientation delivers the library's (N, K) bytes with an NK header;
// Dequantize with ORIENTATION_KN delivers their transpose with a KN header.
TEST(CompressedTensorsServedTest, ListInfoAndDequantizeInTheFormatsOwnOrientationAndTheOther) {
  const char* name = "ct_int4_g32_asym_actorder_bf16";
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
  EXPECT_EQ(info.format(), "compressed_tensors");
  EXPECT_EQ(info.orientation(), v1::ORIENTATION_NK);
  EXPECT_EQ(info.in_features(), 128);
  EXPECT_EQ(info.out_features(), 64);
  EXPECT_EQ(info.group_size(), 32);
  EXPECT_EQ(info.scale_dtype(), v1::DTYPE_BF16);
  // weight_packed 64*16*4 + weight_scale 64*4*2 + weight_zero_point 8*4*4 + g_idx 128*4 + 16.
  EXPECT_EQ(info.packed_bytes(), 4096 + 512 + 128 + 512 + 16);
  ASSERT_EQ(info.stored_tensors_size(), 5);
  EXPECT_EQ(info.stored_tensors(0).role(), "weight_packed");
  EXPECT_THAT(info.stored_tensors(0).shape(), ::testing::ElementsAre(64, 16));
  EXPECT_EQ(info.stored_tensors(2).role(), "weight_zero_point");
  EXPECT_THAT(info.stored_tensors(2).shape(), ::testing::ElementsAre(8, 4));
  EXPECT_EQ(info.stored_tensors(4).role(), "weight_shape");
  EXPECT_EQ(info.stored_tensors(4).dtype(), v1::DTYPE_INT64);
  for (const v1::RawTensorInfo& raw : list.other_tensors())
    EXPECT_NE(raw.name().rfind(kLayer, 0), 0u) << raw.name() << " is a stored tensor";

  grpc::ClientContext info_context;
  v1::GetServerInfoResponse server_info;
  ASSERT_TRUE(server->stub->GetServerInfo(&info_context, {}, &server_info).ok());
  EXPECT_EQ(server_info.model(), dir.string());
  EXPECT_THAT(server_info.model_config_json(), HasSubstr("compressed-tensors"));

  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(CaseFile(name).string());
  ASSERT_TRUE(vectors.ok());
  const std::vector<uint8_t> nk = TensorOf(**vectors, "expected.bf16");

  v1::DequantizeLayersRequest layers;
  layers.set_output_dtype(v1::DTYPE_BF16);
  grpc::ClientContext layers_context;
  auto layers_reader = server->stub->DequantizeLayers(&layers_context, layers);
  const testing::ReadStream all = testing::ReadAll(layers_reader);
  ASSERT_TRUE(all.status.ok()) << all.status.error_message();
  EXPECT_EQ(all.header.orientation(), v1::ORIENTATION_NK);
  EXPECT_THAT(all.header.shape(), ::testing::ElementsAre(64, 128));
  EXPECT_TRUE(all.bytes == nk);

  v1::DequantizeRequest one;
  one.set_tensor(kLayer);
  one.set_output_dtype(v1::DTYPE_BF16);
  one.set_orientation(v1::ORIENTATION_KN);
  grpc::ClientContext one_context;
  auto one_reader = server->stub->Dequantize(&one_context, one);
  const testing::ReadStream kn = testing::ReadAll(one_reader);
  ASSERT_TRUE(kn.status.ok()) << kn.status.error_message();
  EXPECT_EQ(kn.header.orientation(), v1::ORIENTATION_KN);
  EXPECT_THAT(kn.header.shape(), ::testing::ElementsAre(128, 64));
  EXPECT_TRUE(kn.bytes == TransposeNk(nk, 64, 128, 2));
  server->server.reset();
  fs::remove_all(dir);
}

#if DEQUANTD_HAVE_CUDA
// Every compressed-tensors case on the CUDA backend (resident layers; the configured v4, the
// format's own since the nibble-pair kernels): Dequantize in the format's own orientation gives
// the library's bytes, and in (K, N) their transpose, for fp16, bf16 and fp32. GPU only.
TEST_P(CompressedTensorsVectorsTest, CudaBackendDequantizesBitExactToCompressedTensors) {
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
