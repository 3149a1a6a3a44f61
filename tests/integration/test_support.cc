// Integration test helpers (see test_support.h).
#include "tests/integration/test_support.h"
#include "kernels/awq_format.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "formats/safetensors.h"
#include "gtest/gtest.h"

namespace dequantd::testing {
namespace {

namespace fs = std::filesystem;

template <typename T>
absl::Span<const uint8_t> Bytes(const std::vector<T>& v) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
std::string BytesString(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

}  // namespace

QuantView RandomLayer::view() const {
  QuantView v;
  v.shape = shape;
  v.tensors[awq::kQweight] = qweight.data();
  v.tensors[awq::kQzeros] = qzeros.data();
  v.tensors[awq::kScales] = scales.data();
  return v;
}

v1::InlinePackedTensor RandomLayer::ToInline() const {
  v1::InlinePackedTensor t;
  t.set_in_features(shape.K);
  t.set_out_features(shape.N);
  t.set_group_size(shape.group_size);
  t.set_scale_dtype(shape.scale_dtype == DType::kBF16 ? v1::DTYPE_BF16 : v1::DTYPE_FP16);
  t.set_qweight(BytesString(qweight));
  t.set_qzeros(BytesString(qzeros));
  t.set_scales(BytesString(scales));
  return t;
}

std::vector<uint8_t> RandomLayer::Expected(DType out) const {
  std::vector<uint8_t> result(static_cast<size_t>(shape.output_bytes(out)));
  const absl::Status status = DequantizeReference(view(), out, 0, shape.K, result.data());
  EXPECT_TRUE(status.ok()) << status;
  return result;
}

RandomLayer MakeRandomLayer(const std::string& name, int64_t K, int64_t N, int64_t group_size,
                            DType scale_dtype, uint32_t seed) {
  RandomLayer layer;
  layer.name = name;
  layer.shape.K = K;
  layer.shape.N = N;
  layer.shape.group_size = group_size;
  layer.shape.scale_dtype = scale_dtype;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> word;
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  layer.qweight.resize(static_cast<size_t>(awq::QweightElements(layer.shape)));
  for (int32_t& w : layer.qweight) w = static_cast<int32_t>(word(rng));
  layer.qzeros.resize(static_cast<size_t>(awq::QzerosElements(layer.shape)));
  for (int32_t& z : layer.qzeros) z = static_cast<int32_t>(word(rng));
  layer.scales.resize(static_cast<size_t>(awq::ScalesElements(layer.shape)));
  for (uint16_t& s : layer.scales) {
    const float f = scale(rng);
    s = scale_dtype == DType::kBF16 ? FloatToBf16BitsRne(f) : FloatToHalfBitsRne(f);
  }
  return layer;
}

absl::Status WriteCheckpoint(const std::string& dir, const std::vector<RandomLayer>& layers,
                             int64_t group_size) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir ", dir, ": ", ec.message()));
  std::ofstream config(fs::path(dir) / "config.json");
  config << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",)"
         << R"( "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": )"
         << group_size << R"(, "zero_point": true, "version": "gemm"}})" << '\n';
  config.close();
  if (!config) return absl::InternalError("cannot write config.json");
  std::vector<safetensors::TensorToWrite> tensors;
  for (const RandomLayer& l : layers) {
    const int64_t words = l.shape.N / awq::kPackFactor;
    tensors.push_back({l.name + ".qweight", "I32", {l.shape.K, words}, Bytes(l.qweight)});
    tensors.push_back({l.name + ".qzeros", "I32", {l.shape.groups(), words}, Bytes(l.qzeros)});
    tensors.push_back({l.name + ".scales",
                       l.shape.scale_dtype == DType::kBF16 ? "BF16" : "F16",
                       {l.shape.groups(), l.shape.N},
                       Bytes(l.scales)});
  }
  return safetensors::WriteFile((fs::path(dir) / "model.safetensors").string(), tensors);
}

namespace {

// This process's temporary directory, removed when the test program ends.
const fs::path& ProcessTempDir() {
  static const fs::path* const dir = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    auto* d = new fs::path(fs::path(base != nullptr ? base : fs::temp_directory_path().string()) /
                           absl::StrCat("dequantd_integration_", ::getpid()));
    fs::remove_all(*d);
    fs::create_directories(*d);
    return d;
  }();
  return *dir;
}

class RemoveTempDir : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(ProcessTempDir(), ignored);
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveTempDir =
    ::testing::AddGlobalTestEnvironment(new RemoveTempDir);

}  // namespace

absl::StatusOr<std::unique_ptr<TestServer>> StartCpuServerOnCheckpoint(
    const std::string& dir, const std::vector<RandomLayer>& layers, int64_t group_size,
    ServerOptions options) {
  if (absl::Status written = WriteCheckpoint(dir, layers, group_size); !written.ok()) {
    return written;
  }
  options.model_dir = dir;
  return StartCpuServer(std::move(options));
}

std::string MakeTempDir(const std::string& name) {
  const fs::path dir = ProcessTempDir() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

TestServer::~TestServer() {
  client.reset();
  if (server) server->Shutdown(5.0);
}

absl::StatusOr<std::unique_ptr<TestServer>> StartServer(ServerOptions options,
                                                        const std::string& backend) {
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.backend = backend;
  options.cpu_threads = 2;
  // CUDA: keep the autotuner's cache out of $HOME (shared by this process's servers).
  if (options.tune_cache.empty())
    options.tune_cache = (ProcessTempDir() / "tune_cache.json").string();
  absl::StatusOr<std::unique_ptr<DequantServer>> server = DequantServer::Start(options);
  if (!server.ok()) return server.status();
  auto running = std::make_unique<TestServer>();
  running->server = *std::move(server);
  running->address = absl::StrCat("127.0.0.1:", running->server->port());
  ClientOptions client_options;
  client_options.deadline_seconds = 60;  // a hung server fails the test instead of blocking it
  absl::StatusOr<std::unique_ptr<DequantClient>> client =
      DequantClient::Connect(running->address, client_options);
  if (!client.ok()) return client.status();
  running->client = *std::move(client);
  return running;
}

std::string BundledModelDir() {
  if (const char* env = std::getenv("DEQUANTD_MODEL_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  const fs::path dir = fs::path(DEQUANTD_SOURCE_DIR) / "models" / "smollm2-135m-awq";
  return fs::exists(dir / "config.json") ? dir.string() : std::string();
}

std::string DequantctlPath() {
  if (const char* env = std::getenv("DEQUANTCTL"); env != nullptr && *env != '\0') return env;
  return DEQUANTCTL_PATH;
}

bool NamesField(const std::string& message, const std::string& field) {
  auto is_ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t pos = message.find(field); pos != std::string::npos;
       pos = message.find(field, pos + 1)) {
    const size_t end = pos + field.size();
    if ((pos == 0 || !is_ident(message[pos - 1])) &&
        (end == message.size() || !is_ident(message[end]))) {
      return true;
    }
  }
  return false;
}

}  // namespace dequantd::testing
