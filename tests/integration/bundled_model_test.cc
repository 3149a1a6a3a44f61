// The bundled model (SmolLM2-135M quantized to AWQ GEMM by scripts/make-model.sh): ListTensors,
// Dequantize of real layers against DequantizeReference, and against the fp16 output computed
// independently in Python (models/<model>-reference/expected.<layer>.fp16.safetensors).
// Skipped when the model has not been built ($DEQUANTD_MODEL_DIR or models/smollm2-135m-awq).
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_support.h"

namespace dequantd::testing {
namespace {

namespace fs = std::filesystem;

// A layer read straight from model.safetensors into aligned buffers (not through the server).
struct FileLayer {
  QuantShape shape;
  std::vector<int32_t> qweight, qzeros;
  std::vector<uint16_t> scales;

  QuantView view() const { return {shape, qweight.data(), qzeros.data(), scales.data()}; }
};

template <typename T>
std::vector<T> Copy(absl::Span<const uint8_t> bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

class BundledModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(BundledModelDir());
    if (dir_->empty()) return;
    ServerOptions options;
    options.model_dir = *dir_;
    absl::StatusOr<std::unique_ptr<TestServer>> server = StartCpuServer(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
    absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
        safetensors::MappedFile::Open((fs::path(*dir_) / "model.safetensors").string());
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = file->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete file_;
    delete dir_;
    server_ = nullptr;
    file_ = nullptr;
  }
  void SetUp() override {
    if (dir_->empty()) {
      GTEST_SKIP()
          << "bundled model not built (scripts/make-model.sh) and DEQUANTD_MODEL_DIR unset";
    }
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(file_, nullptr);
  }

  static FileLayer ReadLayer(const std::string& name) {
    FileLayer l;
    const auto& tensors = file_->header().tensors;
    const safetensors::TensorEntry& qweight = tensors.at(name + ".qweight");
    const safetensors::TensorEntry& scales = tensors.at(name + ".scales");
    l.shape.K = qweight.shape[0];
    l.shape.N = scales.shape[1];
    l.shape.group_size = l.shape.K / scales.shape[0];
    l.shape.scale_dtype = scales.dtype == "BF16" ? DType::kBF16 : DType::kF16;
    l.qweight = Copy<int32_t>(*file_->TensorBytes(name + ".qweight"));
    l.qzeros = Copy<int32_t>(*file_->TensorBytes(name + ".qzeros"));
    l.scales = Copy<uint16_t>(*file_->TensorBytes(name + ".scales"));
    return l;
  }

  static std::string* dir_;
  static TestServer* server_;
  static safetensors::MappedFile* file_;
};

std::string* BundledModelTest::dir_ = nullptr;
TestServer* BundledModelTest::server_ = nullptr;
safetensors::MappedFile* BundledModelTest::file_ = nullptr;

TEST_F(BundledModelTest, ListTensorsMatchesTheFileAndSmolLM2Shapes) {
  absl::StatusOr<v1::ListTensorsResponse> list = server_->client->ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  int qweights = 0;
  for (const auto& [name, entry] : file_->header().tensors)
    qweights += absl::EndsWith(name, ".qweight");
  EXPECT_EQ(list->tensors_size(), qweights);
  // SmolLM2-135M: 30 blocks x 7 projections; hidden 576, intermediate 1536, 3 KV heads of 64.
  EXPECT_EQ(list->tensors_size(), 30 * 7);
  for (const v1::QuantizedTensorInfo& t : list->tensors()) {
    SCOPED_TRACE(t.name());
    const auto& entry = file_->header().tensors.at(t.name() + ".qweight");
    EXPECT_EQ(t.in_features(), entry.shape[0]);
    EXPECT_EQ(t.out_features(), entry.shape[1] * 8);
    EXPECT_EQ(t.in_features() % t.group_size(), 0);
    if (absl::EndsWith(t.name(), "self_attn.q_proj")) {
      EXPECT_EQ(t.in_features(), 576);
      EXPECT_EQ(t.out_features(), 576);
      EXPECT_EQ(t.group_size(), 64);  // 576 is not a multiple of 128
    } else if (absl::EndsWith(t.name(), "self_attn.k_proj")) {
      EXPECT_EQ(t.out_features(), 192);
    } else if (absl::EndsWith(t.name(), "mlp.down_proj")) {
      EXPECT_EQ(t.in_features(), 1536);
      EXPECT_EQ(t.out_features(), 576);
      EXPECT_EQ(t.group_size(), 128);
    }
  }
}

TEST_F(BundledModelTest, RealLayersMatchReferenceBitForBitInEveryDType) {
  for (const std::string name : {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj",
                                 "model.layers.29.mlp.gate_proj"}) {
    const FileLayer layer = ReadLayer(name);
    for (const auto& [wire, kernel] :
         {std::pair{v1::DTYPE_FP16, DType::kF16}, std::pair{v1::DTYPE_BF16, DType::kBF16},
          std::pair{v1::DTYPE_FP32, DType::kF32}}) {
      SCOPED_TRACE(absl::StrCat(name, " ", OutputDTypeName(wire)));
      std::vector<uint8_t> expected(static_cast<size_t>(layer.shape.output_bytes(kernel)));
      ASSERT_TRUE(
          DequantizeReference(layer.view(), kernel, 0, layer.shape.K, expected.data()).ok());
      v1::DequantizeRequest request;
      request.set_tensor(name);
      request.set_output_dtype(wire);
      absl::StatusOr<DequantizedTensor> result = server_->client->DequantizeToMemory(request);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_THAT(result->header.shape(), ::testing::ElementsAre(layer.shape.K, layer.shape.N));
      EXPECT_TRUE(result->data == expected) << "server result differs from DequantizeReference";
    }
  }
}

TEST_F(BundledModelTest, Fp16MatchesIndependentPythonResultByteForByte) {
  const fs::path reference_dir = fs::path(*dir_ + "-reference");
  std::vector<fs::path> files;
  if (fs::is_directory(reference_dir)) {
    for (const auto& entry : fs::directory_iterator(reference_dir)) {
      const std::string file = entry.path().filename().string();
      if (absl::StartsWith(file, "expected.") && absl::EndsWith(file, ".fp16.safetensors")) {
        files.push_back(entry.path());
      }
    }
  }
  if (files.empty()) GTEST_SKIP() << "no expected.*.fp16.safetensors in " << reference_dir;
  for (const fs::path& path : files) {
    std::string layer = path.filename().string();
    layer =
        std::string(absl::StripSuffix(absl::StripPrefix(layer, "expected."), ".fp16.safetensors"));
    SCOPED_TRACE(layer);
    absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> expected =
        safetensors::MappedFile::Open(path.string());
    ASSERT_TRUE(expected.ok()) << expected.status();
    const safetensors::TensorEntry& entry = (*expected)->header().tensors.at(layer + ".weight");
    EXPECT_EQ(entry.dtype, "F16");
    v1::DequantizeRequest request;
    request.set_tensor(layer);
    request.set_output_dtype(v1::DTYPE_FP16);
    absl::StatusOr<DequantizedTensor> result = server_->client->DequantizeToMemory(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_THAT(result->header.shape(), ::testing::ElementsAreArray(entry.shape));
    const absl::Span<const uint8_t> want = *(*expected)->TensorBytes(layer + ".weight");
    ASSERT_EQ(result->data.size(), want.size());
    EXPECT_EQ(std::memcmp(result->data.data(), want.data(), want.size()), 0)
        << "differs from the Python result";
  }
}

}  // namespace
}  // namespace dequantd::testing
