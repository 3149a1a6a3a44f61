// GPTQ against GPTQModel's own results: every case of tests/data/formats/gptq/ (made by
// tools/format_vectors/make_vectors.py with gptqmodel 7.7.0's packer and dequantizers) is opened
// as a checkpoint (its config.json and its safetensors file as model.safetensors: detection from
// config.json through the registry, the shape from the stored tensors, the stored-value checks),
// and its layer is dequantized by the CPU reference and the CPU path in both orientations into
// fp16, bf16 and fp32, compared bit for bit with the library's expected.<dtype> ((N, K)). Also the
// refusals a GPTQ checkpoint can earn, with their exact codes and messages.
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
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
#include "kernels/gptq_format.h"
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
namespace v1 = ::dequant::v1;
using ::testing::HasSubstr;

constexpr char kLayer[] = "model.layers.0.mlp.down_proj";

fs::path VectorDir() { return testing::VectorDir("gptq"); }
using testing::MakeCheckpoint;
using testing::ReadText;
using testing::TensorOf;
using testing::WriteText;

struct Case {
  const char* name;
  int bits;
  int64_t group_size;  // as the shape holds it (-1 resolved to K)
  uint32_t flags;      // gptq::kZerosV1 / kSym / kNoGidx the shape must carry
};

// K = 128 (256 for g128), N = 64 (docs/formats/gptq.md "Cases").
constexpr Case kCases[] = {
    {"gptq_4bit_g128_sym_v1", 4, 128, gptq::kZerosV1 | gptq::kSym},
    {"gptq_4bit_g128_sym_v2", 4, 128, gptq::kSym},
    {"gptq_4bit_g32_asym_v1", 4, 32, gptq::kZerosV1},
    {"gptq_4bit_g64_asym_v2", 4, 64, 0},
    {"gptq_4bit_g32_asym_descact_v2", 4, 32, 0},
    {"gptq_4bit_g32_sym_descact_v1", 4, 32, gptq::kZerosV1 | gptq::kSym},
    {"gptq_8bit_g128_sym_v1", 8, 128, gptq::kZerosV1 | gptq::kSym},
    {"gptq_8bit_g64_asym_v2", 8, 64, 0},
    {"gptq_8bit_gm1_asym_v1", 8, 128, gptq::kZerosV1},
    {"gptq_2bit_g64_asym_v2", 2, 64, 0},
    {"gptq_3bit_g32_asym_v1", 3, 32, gptq::kZerosV1},
    {"gptq_4bit_g64_asym_v1_zero0", 4, 64, gptq::kZerosV1},
};

constexpr DType kOutDtypes[] = {DType::kF16, DType::kBF16, DType::kF32};

std::string ExpectedName(DType out) {
  return std::string("expected.") + std::string(DTypeName(out));
}

class GptqVectorsTest : public ::testing::TestWithParam<Case> {};

// Every path, both orientations, every output dtype, against GPTQModel's bytes.
TEST_P(GptqVectorsTest, CheckpointDequantizesBitExactToGptqModel) {
  const Case& c = GetParam();
  const fs::path file = VectorDir() / (std::string(c.name) + ".safetensors");
  const fs::path dir =
      MakeCheckpoint(ReadText(VectorDir() / (std::string(c.name) + ".config.json")), file);
  ASSERT_FALSE(dir.empty());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->config().format, Format::kGptq);
  const QuantizedLayer* layer = (*ckpt)->Find(kLayer);
  ASSERT_NE(layer, nullptr);
  const QuantShape& shape = layer->view.shape;
  EXPECT_EQ(shape.format, Format::kGptq);
  EXPECT_EQ(shape.bits, c.bits);
  EXPECT_EQ(shape.group_size, c.group_size);
  EXPECT_EQ(shape.format_flags, c.flags);
  EXPECT_EQ(shape.N, 64);
  EXPECT_EQ(shape.orientation, Orientation::kNK);  // the format's own
  const int64_t K = shape.K;
  const int64_t N = shape.N;

  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(file.string());
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  const bool zero0 = std::string(c.name) == "gptq_4bit_g64_asym_v1_zero0";
  for (DType out : kOutDtypes) {
    SCOPED_TRACE(std::string(DTypeName(out)));
    // The zero0 case: dequantd undoes GPTQModel's v1 word subtraction (its loader's rule), so
    // its fp16 result is TorchLinear's (expected_torchlinear.fp16); the offline converter's
    // per-field rule (expected.*) differs there. bf16/fp32 of that rule have no vector.
    if (zero0 && out != DType::kF16) continue;
    const std::vector<uint8_t> expected =
        TensorOf(**vectors, zero0 ? "expected_torchlinear.fp16" : ExpectedName(out));
    const int64_t elem = DTypeSize(out);
    ASSERT_EQ(static_cast<int64_t>(expected.size()), N * K * elem);

    QuantView nk = layer->view;  // (N, K)
    std::vector<uint8_t> got(expected.size(), 0xA5);
    ASSERT_TRUE(DequantizeReference(nk, out, 0, N, got.data()).ok());
    EXPECT_EQ(got, expected) << "reference (N, K)";
    for (int threads : {1, 3}) {
      std::vector<uint8_t> fast(expected.size(), 0xA5);
      const cpu::CpuDequantOptions options{.threads = threads, .min_elements_per_thread = 1};
      ASSERT_TRUE(cpu::DequantizeCpuWithOptions(nk, out, 0, N, fast.data(), options).ok());
      EXPECT_EQ(fast, expected) << "cpu (N, K), threads " << threads;
      // Rows [5, 40) alone.
      std::vector<uint8_t> part(static_cast<size_t>(35 * K * elem), 0xA5);
      ASSERT_TRUE(cpu::DequantizeCpuWithOptions(nk, out, 5, 40, part.data(), options).ok());
      EXPECT_EQ(0, std::memcmp(part.data(), expected.data() + 5 * K * elem, part.size()));
    }

    QuantView kn = layer->view;  // (K, N): w_kn[k][n] = w_nk[n][k]
    kn.shape.orientation = Orientation::kKN;
    std::vector<uint8_t> want_kn(expected.size());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        std::memcpy(want_kn.data() + (k * N + n) * elem, expected.data() + (n * K + k) * elem,
                    static_cast<size_t>(elem));
    std::vector<uint8_t> got_kn(expected.size(), 0xA5);
    ASSERT_TRUE(DequantizeReference(kn, out, 0, K, got_kn.data()).ok());
    EXPECT_EQ(got_kn, want_kn) << "reference (K, N)";
    for (int threads : {1, 3}) {
      std::vector<uint8_t> fast(expected.size(), 0xA5);
      const cpu::CpuDequantOptions options{.threads = threads, .min_elements_per_thread = 1};
      ASSERT_TRUE(cpu::DequantizeCpuWithOptions(kn, out, 0, K, fast.data(), options).ok());
      EXPECT_EQ(fast, want_kn) << "cpu (K, N), threads " << threads;
    }
  }
  if (zero0) {  // the two GPTQModel rules do disagree on this case
    EXPECT_NE(TensorOf(**vectors, "expected.fp16"),
              TensorOf(**vectors, "expected_torchlinear.fp16"));
  }
  fs::remove_all(dir);
}

// The same layer sent inline (tensors by role) with its checkpoint_format and bits: bit-exact to
// GPTQModel, v1 and v2 alike (the zero convention is the request's, as the bytes cannot say it;
// found by a review: v1 layers sent without it were read as v2, with status OK). Without the
// field it is refused.
TEST_P(GptqVectorsTest, InlineRequestWithItsCheckpointFormatIsBitExact) {
  const Case& c = GetParam();
  if (std::string(c.name) == "gptq_4bit_g64_asym_v1_zero0") GTEST_SKIP() << "TorchLinear rule";
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors = safetensors::MappedFile::Open(
      (VectorDir() / (std::string(c.name) + ".safetensors")).string());
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  const std::vector<uint8_t> qweight = TensorOf(**vectors, std::string(kLayer) + ".qweight");
  const int64_t K = static_cast<int64_t>(qweight.size()) / 64 / 4 * 32 / c.bits;  // N = 64
  v1::InlinePackedTensor packed;
  packed.set_format("gptq");
  packed.set_in_features(K);
  packed.set_out_features(64);
  packed.set_group_size(c.group_size);
  packed.set_bits(c.bits);
  for (const char* role : {"qweight", "qzeros", "scales", "g_idx"}) {
    const std::vector<uint8_t> bytes = TensorOf(**vectors, std::string(kLayer) + "." + role);
    v1::RoleBytes* t = packed.add_tensors();
    t->set_role(role);
    t->set_data(std::string(bytes.begin(), bytes.end()));
  }
  EXPECT_EQ(InlineTensor::FromProto(packed, int64_t{1} << 24).status().message(),
            "packed.checkpoint_format must be 'gptq' (zeros stored minus one) or 'gptq_v2' for "
            "format gptq, got ''");
  packed.set_checkpoint_format((c.flags & gptq::kZerosV1) != 0 ? "gptq" : "gptq_v2");
  absl::StatusOr<InlineTensor> inline_tensor = InlineTensor::FromProto(packed, int64_t{1} << 24);
  ASSERT_TRUE(inline_tensor.ok()) << inline_tensor.status();
  EXPECT_EQ(inline_tensor->view().shape.format_flags & gptq::kZerosV1, c.flags & gptq::kZerosV1);
  const std::vector<uint8_t> expected = TensorOf(**vectors, ExpectedName(DType::kF16));
  std::vector<uint8_t> got(expected.size(), 0xA5);
  ASSERT_TRUE(DequantizeReference(inline_tensor->view(), DType::kF16, 0, 64, got.data()).ok());
  EXPECT_EQ(got, expected);
}

INSTANTIATE_TEST_SUITE_P(Cases, GptqVectorsTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

// ---- Refusals ----------------------------------------------------------------------------------

// A case's config.json with `from` replaced by `to` (the JSON is GPTQModel's, one key per line).
std::string EditedConfig(const char* case_name, const std::string& from, const std::string& to) {
  std::string text = ReadText(VectorDir() / (std::string(case_name) + ".config.json"));
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

absl::Status OpenWith(const std::string& config, const char* case_name) {
  const fs::path dir =
      MakeCheckpoint(config, VectorDir() / (std::string(case_name) + ".safetensors"));
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  fs::remove_all(dir);
  return ckpt.status();
}

TEST(GptqCheckpointTest, CheckpointFormatAndFormatThatDisagreeAreInvalidArgument) {
  const absl::Status s =
      OpenWith(EditedConfig("gptq_4bit_g64_asym_v2", "\"checkpoint_format\": \"gptq_v2\"",
                            "\"checkpoint_format\": \"gptq\""),
               "gptq_4bit_g64_asym_v2");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("quantization_config field 'checkpoint_format' is 'gptq' "
                                     "but field 'format' is 'gptq_v2'; they must agree"));
}

TEST(GptqCheckpointTest, UnservedFormatValueIsInvalidArgument) {
  std::string config = EditedConfig("gptq_4bit_g64_asym_v2", "\"checkpoint_format\": \"gptq_v2\"",
                                    "\"checkpoint_format\": \"gptq_p\"");
  const size_t at = config.find("\"format\": \"gptq_v2\"");
  ASSERT_NE(at, std::string::npos);
  config.replace(at, std::string("\"format\": \"gptq_v2\"").size(), "\"format\": \"gptq_p\"");
  const absl::Status s = OpenWith(config, "gptq_4bit_g64_asym_v2");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("quantization_config field 'checkpoint_format' is 'gptq_p', "
                                     "only 'gptq' (v1 zeros) and 'gptq_v2' are served"));
}

TEST(GptqCheckpointTest, UnsupportedBitsIsInvalidArgument) {
  const absl::Status s = OpenWith(
      EditedConfig("gptq_4bit_g64_asym_v2", "\"bits\": 4", "\"bits\": 5"), "gptq_4bit_g64_asym_v2");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("quantization_config field 'bits' is 5, only 2, 3, 4 and 8 are served"));
}

// Declared bits that do not match the stored words: the qweight shape is refused, named.
TEST(GptqCheckpointTest, BitsThatDoNotFitTheTensorsNameQweight) {
  const absl::Status s = OpenWith(
      EditedConfig("gptq_4bit_g64_asym_v2", "\"bits\": 4", "\"bits\": 8"), "gptq_4bit_g64_asym_v2");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'model.layers.0.mlp.down_proj.qweight' (layer "
                                     "'model.layers.0.mlp.down_proj'): field 'shape' has 16 rows, "
                                     "want K * bits / 32 = 128 * 8 / 32 (K = g_idx length)"));
}

// Symmetric zeros of the other convention: declared gptq (v1), stored gptq_v2 (0x88888888).
TEST(GptqCheckpointTest, DeclaredV1StoredV2SymmetricIsFailedPreconditionNamingQzeros) {
  std::string config = EditedConfig("gptq_4bit_g128_sym_v2", "\"checkpoint_format\": \"gptq_v2\"",
                                    "\"checkpoint_format\": \"gptq\"");
  const size_t at = config.find("\"format\": \"gptq_v2\"");
  ASSERT_NE(at, std::string::npos);
  config.replace(at, std::string("\"format\": \"gptq_v2\"").size(), "\"format\": \"gptq\"");
  const absl::Status s = OpenWith(config, "gptq_4bit_g128_sym_v2");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("layer 'model.layers.0.mlp.down_proj': qzeros: sym is true, so every zero "
                        "point must be 8, but group 0 column 0 decodes to 9 under "
                        "checkpoint_format 'gptq'; the stored zeros are the symmetric zeros of "
                        "checkpoint_format 'gptq_v2'"));
}

// A safetensors copy of a case with its g_idx dropped or replaced.
fs::path CheckpointWithGidx(const char* case_name, const std::string& config, bool drop,
                            int32_t value_at_7) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> src = safetensors::MappedFile::Open(
      (VectorDir() / (std::string(case_name) + ".safetensors")).string());
  EXPECT_TRUE(src.ok());
  std::vector<std::vector<uint8_t>> keep;
  std::vector<safetensors::TensorToWrite> tensors;
  for (const auto& [name, entry] : (*src)->header().tensors) {
    if (name.rfind(kLayer, 0) != 0) continue;
    const bool g_idx = name == std::string(kLayer) + ".g_idx";
    if (g_idx && drop) continue;
    keep.push_back(TensorOf(**src, name));
    if (g_idx) std::memcpy(keep.back().data() + 7 * 4, &value_at_7, 4);
    tensors.push_back({name, entry.dtype, entry.shape, keep.back()});
  }
  std::string templ = ::testing::TempDir() + "/gptq_vectors.XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) return {};
  const fs::path dir(templ);
  WriteText(dir / "config.json", config);
  EXPECT_TRUE(safetensors::WriteFile((dir / "model.safetensors").string(), tensors).ok());
  return dir;
}

TEST(GptqCheckpointTest, GidxOutOfRangeIsInvalidArgumentNamingTheRow) {
  const char* name = "gptq_4bit_g32_asym_descact_v2";
  const fs::path dir =
      CheckpointWithGidx(name, ReadText(VectorDir() / (std::string(name) + ".config.json")),
                         /*drop=*/false, /*value_at_7=*/4);
  const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  fs::remove_all(dir);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ckpt.status().message(),
              HasSubstr("layer 'model.layers.0.mlp.down_proj': g_idx[7] is 4, want [0, 4) "
                        "(groups = K / group_size = 128 / 32)"));
}

TEST(GptqCheckpointTest, MissingGidxWithDescActIsInvalidArgument) {
  const char* name = "gptq_4bit_g32_asym_descact_v2";
  const fs::path dir =
      CheckpointWithGidx(name, ReadText(VectorDir() / (std::string(name) + ".config.json")),
                         /*drop=*/true, 0);
  const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  fs::remove_all(dir);
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ckpt.status().message(),
              HasSubstr("layer 'model.layers.0.mlp.down_proj': tensor "
                        "'model.layers.0.mlp.down_proj.g_idx' is missing; desc_act is true, so "
                        "each row's group must come from g_idx"));
}

// Without desc_act g_idx is optional: the layer stores none and g = k / G gives the same bytes.
TEST(GptqCheckpointTest, MissingGidxWithoutDescActServesTheSameResult) {
  const char* name = "gptq_4bit_g64_asym_v2";
  const fs::path dir =
      CheckpointWithGidx(name, ReadText(VectorDir() / (std::string(name) + ".config.json")),
                         /*drop=*/true, 0);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const QuantizedLayer* layer = (*ckpt)->Find(kLayer);
  ASSERT_NE(layer, nullptr);
  EXPECT_EQ(layer->view.shape.format_flags, gptq::kNoGidx);
  EXPECT_EQ(layer->view.tensors[gptq::kGidx], nullptr);
  EXPECT_EQ(TensorSpecOf(layer->view.shape, gptq::kGidx).elements(), 0);
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open((VectorDir() / (std::string(name) + ".safetensors")).string());
  ASSERT_TRUE(vectors.ok());
  const std::vector<uint8_t> expected = TensorOf(**vectors, "expected.fp16");
  std::vector<uint8_t> got(expected.size());
  ASSERT_TRUE(DequantizeCpu(layer->view, DType::kF16, 0, 64, got.data()).ok());
  EXPECT_EQ(got, expected);
  fs::remove_all(dir);
}

// A GPTQ checkpoint served end to end (CPU backend): ListTensors names the format and its own
// orientation (NK); DequantizeLayers with no orientation delivers GPTQModel's (N, K) bytes with
// an NK header; Dequantize with ORIENTATION_KN delivers their transpose with a KN header.
TEST(GptqServedTest, ListAndDequantizeInTheFormatsOwnOrientationAndTheOther) {
  const char* name = "gptq_4bit_g32_asym_descact_v2";
  const fs::path file = VectorDir() / (std::string(name) + ".safetensors");
  const fs::path dir =
      MakeCheckpoint(ReadText(VectorDir() / (std::string(name) + ".config.json")), file);
  ServerOptions options;
  options.model_dir = dir.string();
  absl::StatusOr<testing::CpuTestServer> server = testing::StartCpuTestServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  namespace v1 = ::dequant::v1;
  grpc::ClientContext list_context;
  v1::ListTensorsResponse list;
  ASSERT_TRUE(server->stub->ListTensors(&list_context, {}, &list).ok());
  ASSERT_EQ(list.tensors_size(), 1);
  EXPECT_EQ(list.tensors(0).format(), "gptq");
  EXPECT_EQ(list.tensors(0).orientation(), v1::ORIENTATION_NK);
  EXPECT_EQ(list.tensors(0).in_features(), 128);
  EXPECT_EQ(list.tensors(0).out_features(), 64);
  ASSERT_EQ(list.tensors(0).stored_tensors_size(), 4);
  EXPECT_EQ(list.tensors(0).stored_tensors(3).role(), "g_idx");

  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(file.string());
  ASSERT_TRUE(vectors.ok());
  const std::vector<uint8_t> nk = TensorOf(**vectors, "expected.bf16");
  std::vector<uint8_t> kn(nk.size());
  for (int64_t n = 0; n < 64; ++n)
    for (int64_t k = 0; k < 128; ++k) std::memcpy(&kn[(k * 64 + n) * 2], &nk[(n * 128 + k) * 2], 2);

  v1::DequantizeLayersRequest layers;
  layers.set_output_dtype(v1::DTYPE_BF16);
  grpc::ClientContext layers_context;
  auto layers_reader = server->stub->DequantizeLayers(&layers_context, layers);
  v1::DequantizeResponse response;
  std::vector<uint8_t> got;
  v1::DequantizeHeader header;
  while (layers_reader->Read(&response)) {
    if (response.has_header()) header = response.header();
    got.insert(got.end(), response.data().begin(), response.data().end());
  }
  ASSERT_TRUE(layers_reader->Finish().ok());
  EXPECT_EQ(header.orientation(), v1::ORIENTATION_NK);
  EXPECT_THAT(header.shape(), ::testing::ElementsAre(64, 128));
  EXPECT_TRUE(got == nk);

  v1::DequantizeRequest one;
  one.set_tensor(kLayer);
  one.set_output_dtype(v1::DTYPE_BF16);
  one.set_orientation(v1::ORIENTATION_KN);
  grpc::ClientContext one_context;
  auto one_reader = server->stub->Dequantize(&one_context, one);
  got.clear();
  while (one_reader->Read(&response)) {
    if (response.has_header()) header = response.header();
    got.insert(got.end(), response.data().begin(), response.data().end());
  }
  ASSERT_TRUE(one_reader->Finish().ok());
  EXPECT_EQ(header.orientation(), v1::ORIENTATION_KN);
  EXPECT_THAT(header.shape(), ::testing::ElementsAre(128, 64));
  EXPECT_TRUE(got == kn);
  server->server.reset();
  fs::remove_all(dir);
}

#if DEQUANTD_HAVE_CUDA
using testing::BytesSink;

// Every GPTQ case on the CUDA backend (resident layers; the configured v4, GPTQ's own since the
// nibble-pair kernels): Dequantize in the format's own orientation gives GPTQModel's bytes,
// and in (K, N) their transpose, for fp16, bf16 and fp32. GPU only.
TEST_P(GptqVectorsTest, CudaBackendDequantizesBitExactToGptqModel) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Case& c = GetParam();
  if (std::string(c.name) == "gptq_4bit_g64_asym_v1_zero0") GTEST_SKIP() << "fp16 only (above)";
  const fs::path file = VectorDir() / (std::string(c.name) + ".safetensors");
  const fs::path dir =
      MakeCheckpoint(ReadText(VectorDir() / (std::string(c.name) + ".config.json")), file);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(CudaBackendOptions{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  ASSERT_TRUE((*backend)->Prepare(**ckpt).ok());
  const QuantizedLayer* layer = (*ckpt)->Find(kLayer);
  ASSERT_NE(layer, nullptr);
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(file.string());
  ASSERT_TRUE(vectors.ok());
  const int64_t K = layer->view.shape.K;
  const int64_t N = layer->view.shape.N;
  for (DType out : kOutDtypes) {
    SCOPED_TRACE(std::string(DTypeName(out)));
    const std::vector<uint8_t> nk = TensorOf(**vectors, ExpectedName(out));
    const int64_t elem = DTypeSize(out);
    DequantSource source;
    source.layer = layer;
    source.orientation = Orientation::kNK;
    BytesSink sink;
    ASSERT_TRUE((*backend)->Dequantize(source, out, 1 << 20, sink).ok());
    EXPECT_THAT(sink.kernel, HasSubstr("v4_vec16"));
    EXPECT_TRUE(sink.bytes == nk);
    std::vector<uint8_t> kn(nk.size());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        std::memcpy(kn.data() + (k * N + n) * elem, nk.data() + (n * K + k) * elem,
                    static_cast<size_t>(elem));
    source.orientation = Orientation::kKN;
    BytesSink kn_sink;
    ASSERT_TRUE((*backend)->Dequantize(source, out, 1 << 20, kn_sink).ok());
    EXPECT_TRUE(kn_sink.bytes == kn);
  }
  backend->reset();
  fs::remove_all(dir);
}
#endif  // DEQUANTD_HAVE_CUDA

}  // namespace
}  // namespace dequantd
