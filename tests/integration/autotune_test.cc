// The autotuner wired into the CUDA backend, end to end (skipped without a GPU): the first
// request for a layer tunes (a miss), the next hits, the result stays bit-exact, and a server
// restarted on the same --tune-cache file serves the layer with no tuning; --pretune tunes the
// model's distinct shapes before serving. Counts are read through GetServerInfo.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_support.h"

namespace dequantd::testing {
namespace {

namespace fs = std::filesystem;

// Two layers of one shape and one of another: two distinct shapes for --pretune. The shapes have
// several v4 candidate configurations (N / 8 divisible by 4, G divisible by 16) and at least 4M
// outputs, so they are tuned (cuda::IsTunable: smaller layers get DefaultConfig untimed).
std::vector<RandomLayer> Layers() {
  return {
      MakeRandomLayer("model.layers.0.mlp.down_proj", 2048, 2048, 128, DType::kF16, 71),
      MakeRandomLayer("model.layers.0.mlp.up_proj", 4096, 2048, 128, DType::kF16, 72),
      MakeRandomLayer("model.layers.1.mlp.down_proj", 2048, 2048, 128, DType::kF16, 73),
  };
}

// Starts a CUDA server; nullptr with *skip set when there is no GPU.
std::unique_ptr<TestServer> StartCuda(const std::string& model_dir, const std::string& tune_cache,
                                      bool pretune, bool* skip) {
  ServerOptions options;
  options.model_dir = model_dir;
  options.tune_cache = tune_cache;
  options.pretune = pretune;
  absl::StatusOr<std::unique_ptr<TestServer>> server = StartServer(options, "cuda");
  *skip = server.status().code() == absl::StatusCode::kFailedPrecondition;
  if (*skip) return nullptr;
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

v1::GetServerInfoResponse Info(TestServer& server) {
  absl::StatusOr<v1::GetServerInfoResponse> info = server.client->GetServerInfo();
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? *info : v1::GetServerInfoResponse();
}

void ExpectBitExact(TestServer& server, const RandomLayer& layer) {
  v1::DequantizeRequest request;
  request.set_tensor(layer.name);
  absl::StatusOr<DequantizedTensor> result = server.client->DequantizeToMemory(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->data == layer.Expected(DType::kF16)) << layer.name;
}

TEST(AutotuneTest, FirstRequestTunesSecondHitsAndARestartDoesNotTune) {
  const std::vector<RandomLayer> layers = Layers();
  const std::string dir = MakeTempDir("autotune_restart");
  ASSERT_TRUE(WriteCheckpoint(dir + "/model", layers, 128).ok());
  const std::string cache =
      dir + "/cache/dequantd/tune_cache.json";  // directory made by the server
  {
    bool skip = false;
    std::unique_ptr<TestServer> server = StartCuda(dir + "/model", cache, false, &skip);
    if (skip) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
    ASSERT_NE(server, nullptr);
    v1::GetServerInfoResponse info = Info(*server);
    EXPECT_EQ(info.tune_cache(), cache);
    EXPECT_EQ(info.autotune_entries(), 0);

    ExpectBitExact(*server, layers[0]);  // miss: tunes 2048x2048
    info = Info(*server);
    EXPECT_EQ(info.autotune_misses(), 1);
    EXPECT_EQ(info.autotune_hits(), 0);
    EXPECT_EQ(info.autotune_tunings(), 1);
    EXPECT_EQ(info.autotune_entries(), 1);

    ExpectBitExact(*server, layers[0]);  // hit
    ExpectBitExact(*server, layers[2]);  // same shape: hit
    info = Info(*server);
    EXPECT_EQ(info.autotune_hits(), 2);
    EXPECT_EQ(info.autotune_tunings(), 1);
    ASSERT_TRUE(fs::exists(cache));
  }
  bool skip = false;
  std::unique_ptr<TestServer> restarted = StartCuda(dir + "/model", cache, false, &skip);
  ASSERT_NE(restarted, nullptr);
  v1::GetServerInfoResponse info = Info(*restarted);
  EXPECT_EQ(info.autotune_entries(), 1);  // loaded from the file
  ExpectBitExact(*restarted, layers[2]);
  info = Info(*restarted);
  EXPECT_EQ(info.autotune_hits(), 1);
  EXPECT_EQ(info.autotune_misses(), 0);
  EXPECT_EQ(info.autotune_tunings(), 0);
}

TEST(AutotuneTest, PretuneTunesEachDistinctShapeBeforeServing) {
  const std::vector<RandomLayer> layers = Layers();
  const std::string dir = MakeTempDir("autotune_pretune");
  ASSERT_TRUE(WriteCheckpoint(dir + "/model", layers, 128).ok());
  const std::string cache = dir + "/tune_cache.json";
  bool skip = false;
  std::unique_ptr<TestServer> server = StartCuda(dir + "/model", cache, true, &skip);
  if (skip) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  ASSERT_NE(server, nullptr);
  v1::GetServerInfoResponse info = Info(*server);
  EXPECT_EQ(info.autotune_tunings(), 2);  // 2048x2048 and 4096x2048, fp16 output
  EXPECT_EQ(info.autotune_entries(), 2);
  for (const RandomLayer& l : layers) ExpectBitExact(*server, l);
  info = Info(*server);
  EXPECT_EQ(info.autotune_hits(), 3);
  EXPECT_EQ(info.autotune_tunings(), 2);
}

TEST(AutotuneTest, CudaBenchmarkRpcUsesTheKernelVariants) {
  const std::string dir = MakeTempDir("autotune_benchmark");
  ASSERT_TRUE(WriteCheckpoint(dir + "/model", Layers(), 128).ok());
  bool skip = false;
  std::unique_ptr<TestServer> server =
      StartCuda(dir + "/model", dir + "/tune_cache.json", false, &skip);
  if (skip) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  ASSERT_NE(server, nullptr);
  v1::BenchmarkRequest request;
  request.add_tensors("model.layers.0.mlp.up_proj");
  request.add_variants("v4_vec16");
  request.set_trials(2);
  request.set_runs(3);
  absl::StatusOr<v1::BenchmarkResponse> response = server->client->Benchmark(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->backend(), "cuda");
  ASSERT_EQ(response->rows_size(), 2);  // v4_vec16, copy
  EXPECT_EQ(response->rows(0).variant(), "v4_vec16");
  EXPECT_TRUE(response->rows(0).correct());
  EXPECT_EQ(response->rows(0).in_features(), 4096);
  EXPECT_EQ(response->rows(0).out_features(), 2048);
  EXPECT_GT(response->rows(0).throughput_seconds(), 0);
  EXPECT_GT(response->rows(0).throughput_fraction_of_peak(), 0);
}

}  // namespace
}  // namespace dequantd::testing
