// A bounded soak: 32 concurrent clients for DEQUANTD_SOAK_SECONDS (default 60) against a dequantd
// child on the CPU backend, mixing good requests (random layers, every output dtype) with bad
// ones (wrong byte counts, unknown tensors, bytes that are not protobuf, gzip-compressed requests
// refused by --accept-compressed-requests=false, clients that cancel mid-stream). Asserts: no
// unexpected status code, every OK result bit-exact against the CPU reference, and afterwards RSS
// back under idle + 64 MiB, the descriptor count back to idle and the thread count within 4 of
// idle. Prints the figures (docs/hardening.md records them).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dequant/v1/dequant.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/hardening/abuse_client.h"
#include "tests/hardening/process_stats.h"
#include "tests/integration/test_support.h"

namespace dequantd::testing {
namespace {

namespace v1 = ::dequant::v1;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int kClients = 32;
constexpr int64_t kRssHeadroomBytes = 64 * kMiB;
// gRPC keeps a few pool threads (executor, timer manager) it started under load; measured: 3.
constexpr int kThreadSlack = 4;

struct GoodCase {
  RandomLayer layer;
  DType out;
  v1::DType wire_out;
  std::vector<uint8_t> expected;
  v1::DequantizeRequest request;
};

std::vector<GoodCase> MakeGoodCases() {
  const struct {
    int64_t K, N, G;
    DType scale, out;
    v1::DType wire;
  } shapes[] = {
      {128, 64, 32, DType::kF16, DType::kF16, v1::DTYPE_FP16},
      {256, 128, 128, DType::kBF16, DType::kBF16, v1::DTYPE_BF16},
      {512, 256, -1, DType::kF16, DType::kF32, v1::DTYPE_FP32},
      {1024, 512, 128, DType::kF16, DType::kF16, v1::DTYPE_FP16},
  };
  std::vector<GoodCase> cases;
  uint32_t seed = 1100;
  for (const auto& s : shapes) {
    GoodCase c;
    // G = -1 (one group) is sent as -1; the layer itself is made with G = K.
    c.layer = MakeRandomLayer("soak", s.K, s.N, s.G == -1 ? s.K : s.G, s.scale, seed++);
    c.out = s.out;
    c.wire_out = s.wire;
    c.expected = c.layer.Expected(s.out);
    *c.request.mutable_packed() = c.layer.ToInline();
    c.request.mutable_packed()->set_group_size(s.G);
    c.request.set_output_dtype(s.wire);
    c.request.set_chunk_bytes(64 << 10);
    cases.push_back(std::move(c));
  }
  return cases;
}

// Tallies of one soak, shared by the clients.
struct Tally {
  std::mutex mu;
  std::map<std::string, int64_t> by_kind_and_code;  // "good/OK" -> count
  std::vector<std::string> failures;                // unexpected outcomes (first 20 kept)
  void Add(const std::string& kind, grpc::StatusCode code) {
    std::lock_guard<std::mutex> lock(mu);
    ++by_kind_and_code[kind + "/" + std::to_string(code)];
  }
  void Fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (failures.size() < 20) failures.push_back(what);
  }
};

// Reads a Dequantize stream to its end; the concatenated data.
grpc::Status ReadAll(grpc::ClientReader<v1::DequantizeResponse>& reader, std::string* data) {
  v1::DequantizeResponse response;
  while (reader.Read(&response)) data->append(response.data());
  return reader.Finish();
}

void RunClient(int id, const DequantdChild& server, const std::vector<GoodCase>& good,
               std::chrono::steady_clock::time_point end, Tally& tally) {
  auto channel = server.Channel();
  auto stub = v1::DequantService::NewStub(channel);
  const std::string non_utf8("\x0a\x02\xc3\x28", 4);
  for (int64_t i = id; std::chrono::steady_clock::now() < end; i += kClients) {
    const int kind = static_cast<int>(i % 10);
    const GoodCase& c = good[static_cast<size_t>(i / 10) % good.size()];
    auto expect = [&](const char* name, const grpc::Status& s, grpc::StatusCode want) {
      tally.Add(name, s.error_code());
      if (s.error_code() != want) {
        tally.Fail(std::string(name) + ": code " + std::to_string(s.error_code()) + " " +
                   s.error_message());
      }
    };
    if (kind <= 4) {  // good: half of the traffic
      grpc::ClientContext context;
      auto reader = stub->Dequantize(&context, c.request);
      std::string data;
      const grpc::Status s = ReadAll(*reader, &data);
      expect("good", s, grpc::StatusCode::OK);
      if (s.ok() && (data.size() != c.expected.size() ||
                     std::memcmp(data.data(), c.expected.data(), data.size()) != 0)) {
        tally.Fail("good: result differs from the reference (K " + std::to_string(c.layer.shape.K) +
                   ")");
      }
    } else if (kind == 5) {  // qweight one byte short
      v1::DequantizeRequest bad = c.request;
      bad.mutable_packed()->mutable_qweight()->pop_back();
      grpc::ClientContext context;
      auto reader = stub->Dequantize(&context, bad);
      std::string data;
      expect("short_qweight", ReadAll(*reader, &data), grpc::StatusCode::INVALID_ARGUMENT);
    } else if (kind == 6) {  // unknown tensor (no model loaded)
      v1::DequantizeRequest bad;
      bad.set_tensor("model.layers.0.nope");
      grpc::ClientContext context;
      auto reader = stub->Dequantize(&context, bad);
      std::string data;
      expect("unknown_tensor", ReadAll(*reader, &data), grpc::StatusCode::NOT_FOUND);
    } else if (kind == 7) {  // not protobuf
      expect("not_protobuf",
             CallWithRawRequest(channel, "/dequant.v1.DequantService/Dequantize", non_utf8),
             grpc::StatusCode::INVALID_ARGUMENT);
    } else if (kind == 8) {  // gzip-compressed, refused before it is inflated
      expect("compressed", SendCompressed(*stub, c.request), grpc::StatusCode::UNIMPLEMENTED);
    } else {  // cancels after the first message
      grpc::ClientContext context;
      auto reader = stub->Dequantize(&context, c.request);
      v1::DequantizeResponse response;
      reader->Read(&response);
      context.TryCancel();
      while (reader->Read(&response)) {
      }
      const grpc::Status s = reader->Finish();
      // OK when the whole (small) result had already arrived.
      tally.Add("cancelled", s.error_code());
      if (s.error_code() != grpc::StatusCode::CANCELLED && !s.ok()) {
        tally.Fail("cancelled: code " + std::to_string(s.error_code()) + " " + s.error_message());
      }
    }
  }
}

double Seconds() {
  const char* env = std::getenv("DEQUANTD_SOAK_SECONDS");
  return env != nullptr && std::atof(env) > 0 ? std::atof(env) : 60.0;
}

TEST(SoakTest, MixedTrafficKeepsStatusesResultsAndResourcesBounded) {
  DequantdChild server(
      {"--max-request-bytes=8388608", "--accept-compressed-requests=false"}, /*alarm_seconds=*/
      static_cast<unsigned>(Seconds()) + 180);
  ASSERT_GT(server.port, 0) << server.process.output();
  const pid_t pid = server.process.pid();
  const std::vector<GoodCase> good = MakeGoodCases();

  // Idle figures after one round of every kind (gRPC starts its threads lazily).
  {
    Tally warmup;
    RunClient(0, server, good, std::chrono::steady_clock::now(), warmup);
  }
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const int64_t idle_rss = ResidentBytes(pid);
  const int idle_threads = ThreadCount(pid);
  const int idle_fds = OpenFdCount(pid);

  Tally tally;
  std::atomic<int64_t> peak_rss{idle_rss};
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(Seconds()));
  std::vector<std::thread> clients;
  for (int id = 0; id < kClients; ++id) {
    clients.emplace_back([&, id] { RunClient(id, server, good, end, tally); });
  }
  int peak_threads = idle_threads;
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    peak_rss = std::max<int64_t>(peak_rss, ResidentBytes(pid));
    peak_threads = std::max(peak_threads, ThreadCount(pid));
  }
  for (std::thread& t : clients) t.join();

  // Back to idle: allow the malloc trimmer (2 s) and gRPC's idle threads time to settle.
  int64_t rss = 0;
  int threads = 0, fds = 0;
  for (int i = 0; i < 60; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    rss = ResidentBytes(pid);
    threads = ThreadCount(pid);
    fds = OpenFdCount(pid);
    if (rss <= idle_rss + kRssHeadroomBytes && threads <= idle_threads + kThreadSlack &&
        fds <= idle_fds) {
      break;
    }
  }

  int64_t total = 0;
  std::printf("soak: %d clients, %.0f s\n", kClients, Seconds());
  for (const auto& [key, n] : tally.by_kind_and_code) {
    std::printf("soak:   %-20s %lld\n", key.c_str(), static_cast<long long>(n));
    total += n;
  }
  std::printf(
      "soak: %lld calls; RSS idle %lld MiB, peak %lld MiB, after %lld MiB; threads idle "
      "%d, peak %d, after %d; fds idle %d, after %d\n",
      static_cast<long long>(total), static_cast<long long>(idle_rss / kMiB),
      static_cast<long long>(peak_rss.load() / kMiB), static_cast<long long>(rss / kMiB),
      idle_threads, peak_threads, threads, idle_fds, fds);
  for (const std::string& f : tally.failures) ADD_FAILURE() << f;
  EXPECT_TRUE(tally.failures.empty());
  EXPECT_GT(tally.by_kind_and_code["good/0"], 0);
  EXPECT_LE(rss, idle_rss + kRssHeadroomBytes);
  EXPECT_LE(threads, idle_threads + kThreadSlack);
  EXPECT_LE(fds, idle_fds);
}

}  // namespace
}  // namespace dequantd::testing
