// The same end-to-end path on the CUDA backend: a server started with backend "cuda" serves the
// test checkpoint (resident on the GPU) and inline input bit-identical to DequantizeReference,
// and the bundled model's real layers too when it is present, also while a Benchmark call
// collects hardware counters. Skipped without a GPU (or in a build without CUDA): the server then
// refuses backend "cuda" with FAILED_PRECONDITION.
#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_support.h"

namespace dequantd::testing {
namespace {

namespace fs = std::filesystem;

constexpr std::pair<v1::DType, DType> kDTypes[] = {
    {v1::DTYPE_FP16, DType::kF16}, {v1::DTYPE_BF16, DType::kBF16}, {v1::DTYPE_FP32, DType::kF32}};

// Starts a CUDA server on `model_dir`; sets *skip when there is no GPU.
std::unique_ptr<TestServer> StartCuda(const std::string& model_dir, bool* skip) {
  ServerOptions options;
  options.model_dir = model_dir;
  absl::StatusOr<std::unique_ptr<TestServer>> server = StartServer(options, "cuda");
  *skip = server.status().code() == absl::StatusCode::kFailedPrecondition;
  if (*skip) return nullptr;
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(CudaBackendTest, TestCheckpointAndInlineAreBitExact) {
  const std::vector<RandomLayer> layers = {
      MakeRandomLayer("model.layers.0.mlp.down_proj", 1024, 1440, 128, DType::kF16, 41),
      MakeRandomLayer("model.layers.0.mlp.up_proj", 256, 4672, 128, DType::kBF16, 42),
  };
  const std::string dir = MakeTempDir("cuda_backend");
  ASSERT_TRUE(WriteCheckpoint(dir, layers, 128).ok());
  bool skip = false;
  std::unique_ptr<TestServer> server = StartCuda(dir, &skip);
  if (skip) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->server->backend_name(), "cuda");

  absl::StatusOr<v1::ListTensorsResponse> list = server->client->ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->tensors_size(), 2);
  for (const v1::QuantizedTensorInfo& t : list->tensors()) EXPECT_TRUE(t.resident_on_device());

  for (const RandomLayer& l : layers) {
    for (const auto& [wire, kernel] : kDTypes) {
      SCOPED_TRACE(absl::StrCat(l.name, " ", OutputDTypeName(wire)));
      v1::DequantizeRequest request;
      request.set_tensor(l.name);
      request.set_output_dtype(wire);
      request.set_chunk_bytes(64 << 10);  // many chunks
      absl::StatusOr<DequantizedTensor> result = server->client->DequantizeToMemory(request);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->header.backend(), "cuda");
      EXPECT_TRUE(result->data == l.Expected(kernel));
    }
  }
  // Inline input: staged host -> device. K = 10944 (not a multiple of 128 * 2^k), N = 136.
  const RandomLayer inline_layer = MakeRandomLayer("inline", 10944, 136, 64, DType::kF16, 43);
  for (const auto& [wire, kernel] : kDTypes) {
    SCOPED_TRACE(absl::StrCat("inline ", OutputDTypeName(wire)));
    v1::DequantizeRequest request;
    *request.mutable_packed() = inline_layer.ToInline();
    request.set_output_dtype(wire);
    absl::StatusOr<DequantizedTensor> result = server->client->DequantizeToMemory(request);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_TRUE(result->data == inline_layer.Expected(kernel));
  }
  // A bad request, then a good one.
  v1::DequantizeRequest bad;
  *bad.mutable_packed() = inline_layer.ToInline();
  bad.mutable_packed()->set_out_features(130);
  EXPECT_EQ(server->client->DequantizeToMemory(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::DequantizeRequest good;
  good.set_tensor(layers[0].name);
  absl::StatusOr<DequantizedTensor> again = server->client->DequantizeToMemory(good);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->data == layers[0].Expected(DType::kF16));
}

// Hardware-counter collection profiles every kernel of the context; Dequantize calls running
// meanwhile must still be bit-exact, and the benchmark must either carry counters or say why not
// (the device was busy every time, or the driver forbids profiling).
TEST(CudaBackendTest, DequantizeStaysExactWhileBenchmarkCollectsCounters) {
  const RandomLayer layer =
      MakeRandomLayer("model.layers.0.mlp.down_proj", 4096, 4096, 128, DType::kF16, 44);
  const std::string dir = MakeTempDir("cuda_counters");
  ASSERT_TRUE(WriteCheckpoint(dir, {layer}, 128).ok());
  bool skip = false;
  std::unique_ptr<TestServer> server = StartCuda(dir, &skip);
  if (skip) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  ASSERT_NE(server, nullptr);
  const std::vector<uint8_t> expected = layer.Expected(DType::kF16);

  std::atomic<bool> done{false};
  std::atomic<int> exact{0}, wrong{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 3; ++t) {
    clients.emplace_back([&] {
      v1::DequantizeRequest request;
      request.set_tensor(layer.name);
      while (!done.load()) {
        absl::StatusOr<DequantizedTensor> r = server->client->DequantizeToMemory(request);
        (r.ok() && r->data == expected ? exact : wrong).fetch_add(1);
      }
    });
  }
  v1::BenchmarkRequest request;
  request.add_tensors(layer.name);
  request.add_variants("v4_vec16");
  request.set_trials(1);
  request.set_runs(2);
  request.set_hardware_counters(true);
  absl::StatusOr<v1::BenchmarkResponse> response = server->client->Benchmark(request);
  done.store(true);
  for (std::thread& t : clients) t.join();

  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_GE(response->rows_size(), 1);
  EXPECT_TRUE(response->rows(0).correct());
  if (response->rows(0).counters().empty()) {
    EXPECT_THAT(response->note(), ::testing::HasSubstr("hardware counters unavailable"));
  } else {
    EXPECT_EQ(response->rows(0).counters().size(), 5);
  }
  EXPECT_GT(exact.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
}

TEST(CudaBackendTest, BundledModelEveryLayerMatchesReference) {
  const std::string dir = BundledModelDir();
  if (dir.empty()) GTEST_SKIP() << "bundled model not built";
  bool skip = false;
  std::unique_ptr<TestServer> server = StartCuda(dir, &skip);
  if (skip) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
      safetensors::MappedFile::Open((fs::path(dir) / "model.safetensors").string());
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<v1::ListTensorsResponse> list = server->client->ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  int checked = 0;
  for (const v1::QuantizedTensorInfo& t : list->tensors()) {
    // Copy the layer out of the file (aligned) and compute the reference on the CPU.
    RandomLayer l;
    l.name = t.name();
    l.shape = {t.in_features(), t.out_features(), t.group_size(),
               t.scale_dtype() == v1::DTYPE_BF16 ? DType::kBF16 : DType::kF16};
    auto copy = [&](const std::string& suffix, auto* out) {
      const absl::Span<const uint8_t> b = *(*file)->TensorBytes(t.name() + suffix);
      out->resize(b.size() / sizeof((*out)[0]));
      std::memcpy(out->data(), b.data(), b.size());
    };
    copy(".qweight", &l.qweight);
    copy(".qzeros", &l.qzeros);
    copy(".scales", &l.scales);
    for (const auto& [wire, kernel] : kDTypes) {
      SCOPED_TRACE(absl::StrCat(t.name(), " ", OutputDTypeName(wire)));
      v1::DequantizeRequest request;
      request.set_tensor(t.name());
      request.set_output_dtype(wire);
      absl::StatusOr<DequantizedTensor> result = server->client->DequantizeToMemory(request);
      ASSERT_TRUE(result.ok()) << result.status();
      ASSERT_TRUE(result->data == l.Expected(kernel));
      ++checked;
    }
  }
  EXPECT_EQ(checked, list->tensors_size() * 3);
}

}  // namespace
}  // namespace dequantd::testing
