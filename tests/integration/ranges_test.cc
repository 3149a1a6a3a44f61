// Parallel byte-range streams against a real dequantd (in-process, CPU backend): a layer fetched
// over S streams on S connections equals the reference and the single-stream result; layers
// spread over S DequantizeLayers calls equal the reference; a server stopped in the middle of a
// range stream and restarted on the same port: the client resumes from the last byte received
// (no byte fetched twice); a server that does not come back: the client fails after its bounded
// retries, saying where the range broke.
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/ranged_fetch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/integration/test_support.h"

namespace dequantd::testing {
namespace {

using ::testing::HasSubstr;

class RangesTest : public SharedServerSuite<RangesTest> {
 protected:
  static void SetUpTestSuite() {
    StartSharedServer(
        "ranges",
        {MakeRandomLayer("model.layers.0.mlp.up_proj", 512, 1024, 128, DType::kF16, 3),
         MakeRandomLayer("model.layers.0.mlp.down_proj", 256, 512, 128, DType::kBF16, 4),
         MakeRandomLayer("model.layers.1.mlp.up_proj", 128, 2048, 128, DType::kF16, 5)},
        128);
  }
  static std::unique_ptr<ParallelClient> Parallel(int connections) {
    absl::StatusOr<std::unique_ptr<ParallelClient>> client =
        ParallelClient::Connect(server_->address, {}, connections);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }
};

TEST_F(RangesTest, FourStreamsEqualTheReferenceAndOneStreamK512N1024G128ToFp16Bf16Fp32) {
  std::unique_ptr<ParallelClient> parallel = Parallel(4);
  ASSERT_NE(parallel, nullptr);
  for (auto [dtype, wire] :
       {std::pair{DType::kF16, v1::DTYPE_FP16}, std::pair{DType::kBF16, v1::DTYPE_BF16},
        std::pair{DType::kF32, v1::DTYPE_FP32}}) {
    v1::DequantizeRequest request;
    request.set_tensor(layer(0).name);
    request.set_output_dtype(wire);
    request.set_chunk_bytes(64 << 10);
    absl::StatusOr<DequantizedTensor> four = parallel->DequantizeToMemory(request, 4);
    ASSERT_TRUE(four.ok()) << four.status();
    absl::StatusOr<DequantizedTensor> one = client().DequantizeToMemory(request);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(four->data, layer(0).Expected(dtype));
    EXPECT_EQ(four->data, one->data);
    EXPECT_EQ(four->header.total_bytes(), one->header.total_bytes());
  }
}

TEST_F(RangesTest, InlineLayerOverThreeStreamsEqualsTheReference) {
  std::unique_ptr<ParallelClient> parallel = Parallel(3);
  ASSERT_NE(parallel, nullptr);
  v1::DequantizeRequest request;
  *request.mutable_packed() = layer(1).ToInline();
  absl::StatusOr<DequantizedTensor> result = parallel->DequantizeToMemory(request, 3);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->data, layer(1).Expected(DType::kF16));
}

TEST_F(RangesTest, LayersSpreadOverStreamsEqualTheReference) {
  std::unique_ptr<ParallelClient> parallel = Parallel(2);
  ASSERT_NE(parallel, nullptr);
  v1::DequantizeLayersRequest request;
  request.set_output_dtype(v1::DTYPE_FP32);
  const std::vector<std::vector<std::string>> subsets = {{layer(0).name, layer(2).name},
                                                         {layer(1).name}};
  std::vector<std::vector<DequantizedTensor>> received(subsets.size());
  absl::StatusOr<std::vector<v1::DequantizeHeader>> headers =
      FetchLayerSubsets(parallel->clients(), request, subsets, [&](size_t stream) {
        LayersSink sink;
        sink.on_header = [&received, stream](const v1::DequantizeHeader& header) {
          received[stream].push_back(DequantizedTensor{.header = header, .data = {}});
          return absl::OkStatus();
        };
        sink.on_chunk = [&received, stream](int64_t, absl::Span<const uint8_t> data) {
          std::vector<uint8_t>& bytes = received[stream].back().data;
          bytes.insert(bytes.end(), data.begin(), data.end());
          return absl::OkStatus();
        };
        return sink;
      });
  ASSERT_TRUE(headers.ok()) << headers.status();
  ASSERT_EQ(headers->size(), 3u);
  ASSERT_EQ(received[0].size(), 2u);
  ASSERT_EQ(received[1].size(), 1u);
  EXPECT_EQ(received[0][0].header.tensor(), layer(0).name);
  EXPECT_EQ(received[0][0].data, layer(0).Expected(DType::kF32));
  EXPECT_EQ(received[0][1].data, layer(2).Expected(DType::kF32));
  EXPECT_EQ(received[1][0].data, layer(1).Expected(DType::kF32));
}

// A server with no model on 127.0.0.1:`port` (0: a free one).
std::unique_ptr<DequantServer> StartInlineServer(int port) {
  ServerOptions options;
  options.model_dir = "";
  options.listen = "127.0.0.1:" + std::to_string(port);
  options.metrics_listen = "";
  options.backend = "cpu";
  options.cpu_threads = 2;
  absl::StatusOr<std::unique_ptr<DequantServer>> server = DequantServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// Fetches a 16 MiB fp32 result in one range stream; when the first bytes have arrived, the
// server is stopped (calls cancelled) and, if `restart`, started again on the same port.
struct RestartRun {
  absl::StatusOr<v1::DequantizeHeader> header;
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> expected;
  int64_t bytes_delivered = 0;  // every write_at's size, summed
};

RestartRun FetchAcrossAServerStop(bool restart) {
  RestartRun run;
  std::unique_ptr<DequantServer> server = StartInlineServer(0);
  if (server == nullptr) return run;
  const int port = server->port();
  const RandomLayer layer = MakeRandomLayer("inline", 1024, 4096, 128, DType::kF16, 9);
  run.expected = layer.Expected(DType::kF32);
  run.bytes.assign(run.expected.size(), 0);
  v1::DequantizeRequest request;
  *request.mutable_packed() = layer.ToInline();
  request.set_output_dtype(v1::DTYPE_FP32);
  request.set_chunk_bytes(64 << 10);
  absl::StatusOr<std::unique_ptr<ParallelClient>> client =
      ParallelClient::Connect("127.0.0.1:" + std::to_string(port), {}, 1);
  if (!client.ok()) return run;

  std::mutex mu;
  std::condition_variable cv;
  bool first_bytes = false, stopped = false;
  RangeSink sink;
  sink.write_at = [&](int64_t offset, absl::Span<const uint8_t> data) {
    std::copy(data.begin(), data.end(), run.bytes.begin() + offset);
    run.bytes_delivered += static_cast<int64_t>(data.size());
    std::unique_lock<std::mutex> lock(mu);
    if (!first_bytes) {
      first_bytes = true;
      cv.notify_all();
      cv.wait(lock, [&] { return stopped; });  // the stream breaks while we hold it
    }
    return absl::OkStatus();
  };
  std::thread stopper([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return first_bytes; });
    lock.unlock();
    server->Shutdown(0);
    server.reset();
    if (restart) server = StartInlineServer(port);
    lock.lock();
    stopped = true;
    cv.notify_all();
  });
  run.header = FetchRanges((*client)->clients(), request, static_cast<int64_t>(run.expected.size()),
                           1, sink, RetryOptions{.max_retries = 6, .retry_delay_seconds = 0.2});
  stopper.join();
  return run;
}

TEST(RangesRestartTest, AServerRestartedMidStreamIsResumedFromTheLastByteReceived) {
  const RestartRun run = FetchAcrossAServerStop(/*restart=*/true);
  ASSERT_TRUE(run.header.ok()) << run.header.status();
  EXPECT_EQ(run.bytes, run.expected);
  EXPECT_EQ(run.bytes_delivered, static_cast<int64_t>(run.expected.size()))
      << "bytes were fetched twice: the stream was not resumed from its last byte";
}

TEST(RangesRestartTest, AServerThatDoesNotComeBackFailsAfterTheRetriesSayingWhere) {
  const RestartRun run = FetchAcrossAServerStop(/*restart=*/false);
  ASSERT_FALSE(run.header.ok());
  EXPECT_EQ(run.header.status().code(), absl::StatusCode::kUnavailable) << run.header.status();
  EXPECT_THAT(std::string(run.header.status().message()),
              HasSubstr("range [0, 16777216): stream broke at byte"));
  EXPECT_THAT(std::string(run.header.status().message()), HasSubstr("after 6 re-requests"));
}

}  // namespace
}  // namespace dequantd::testing
