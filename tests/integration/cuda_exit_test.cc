// The dequantd process on the GPU exits cleanly after serving every kind of call: a dequantd
// child process (backend cuda) serves Dequantize (resident and inline), a whole-model
// DequantizeLayers and a Benchmark, then gets SIGTERM and must exit with status 0 (issue 8: it
// used to segfault after "dequantd stopped" once a whole-model DequantizeLayers had run, because
// the backend's destructor reported freed buffers to the already destroyed metrics).
// The default model is synthetic: 9 layers of 4096 x 16384 plus 40 small ones, so the fp32
// whole-model result (2.3 GiB) exceeds the backend's 2 GiB buffer cache, the case that crashed.
// $DEQUANTD_EXIT_TEST_MODEL names another model directory instead (e.g. an 8B-shaped one made on
// the GPU machine); $DEQUANTD names the dequantd binary (else the build's). Skipped without a GPU.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_support.h"
#include "tests/server/dequantd_process.h"  // DequantdBinary
#if DEQUANTD_HAVE_CUDA
#include "server/backend/cuda/cuda_backend.h"
#endif

extern char** environ;

namespace dequantd::testing {
namespace {

bool HaveGpu() {
#if DEQUANTD_HAVE_CUDA
  return CudaDeviceCount() > 0;
#else
  return false;
#endif
}

// A TCP port that was free a moment ago on 127.0.0.1.
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Waits up to `seconds` for `pid`; its wait status, or -1 if it is still running (then killed).
int WaitFor(pid_t pid, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

TEST(CudaExitTest, ExitsZeroOnSigtermAfterEveryKindOfCall) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  const char* model_env = std::getenv("DEQUANTD_EXIT_TEST_MODEL");
  std::string model = model_env != nullptr ? model_env : "";
  std::vector<RandomLayer> layers;
  if (model.empty()) {
    for (int i = 0; i < 9; ++i) {
      layers.push_back(MakeRandomLayer(absl::StrCat("model.layers.", i, ".mlp.up_proj"), 4096,
                                       16384, 128, DType::kF16, 700 + i));
    }
    for (int i = 0; i < 40; ++i) {
      layers.push_back(MakeRandomLayer(absl::StrCat("model.layers.", i, ".self_attn.k_proj"), 256,
                                       512, 128, i % 2 ? DType::kBF16 : DType::kF16, 800 + i));
    }
    model = MakeTempDir("cuda_exit_model");
    ASSERT_TRUE(WriteCheckpoint(model, layers, 128).ok());
  }
  const int port = FreePort();
  ASSERT_NE(port, 0);
  std::vector<std::string> words = {::dequantd::testing::DequantdBinary(),
                                    "--backend=cuda",
                                    "--model=" + model,
                                    absl::StrCat("--listen=127.0.0.1:", port),
                                    "--metrics-listen=127.0.0.1:0",
                                    "--tune-cache=" + MakeTempDir("cuda_exit_cache") + "/t.json",
                                    "--shutdown-deadline=5"};
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  const std::string log = MakeTempDir("cuda_exit_log") + "/dequantd.log";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  ASSERT_EQ(::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);

  // Wait until it serves (uploading a large model takes a while).
  const std::string address = absl::StrCat("127.0.0.1:", port);
  absl::StatusOr<std::unique_ptr<DequantClient>> connected = DequantClient::Connect(address);
  ASSERT_TRUE(connected.ok()) << connected.status();
  DequantClient& client = **connected;
  absl::StatusOr<v1::ListTensorsResponse> list;
  for (int i = 0; i < 1200; ++i) {
    list = client.ListTensors();
    if (list.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(list.ok()) << list.status() << "\n" << ReadFile(log);
  ASSERT_GT(list->tensors_size(), 0);
  const std::string first = list->tensors(0).name();

  // Dequantize: a resident layer, and inline input.
  v1::DequantizeRequest request;
  request.set_tensor(first);
  absl::StatusOr<DequantizedTensor> one = client.DequantizeToMemory(request);
  ASSERT_TRUE(one.ok()) << one.status();
  for (const RandomLayer& l : layers) {
    if (l.name == first) {
      EXPECT_TRUE(one->data == l.Expected(DType::kF16)) << first;
    }
  }
  const RandomLayer small = MakeRandomLayer("inline", 512, 256, 128, DType::kF16, 900);
  v1::DequantizeRequest inline_request;
  *inline_request.mutable_packed() = small.ToInline();
  absl::StatusOr<DequantizedTensor> inlined = client.DequantizeToMemory(inline_request);
  ASSERT_TRUE(inlined.ok()) << inlined.status();
  EXPECT_TRUE(inlined->data == small.Expected(DType::kF16));

  // The whole model, fp32 (and fp16 for a given model), counted as it streams in; the small
  // synthetic layers are also checked byte for byte.
  // A given (large) model only in fp16: through gRPC, its fp32 would take minutes.
  const std::vector<v1::DType> dtypes =
      layers.empty() ? std::vector<v1::DType>{v1::DTYPE_FP16}
                     : std::vector<v1::DType>{v1::DTYPE_FP32, v1::DTYPE_FP16};
  for (v1::DType dtype : dtypes) {
    v1::DequantizeLayersRequest all;
    all.set_output_dtype(dtype);
    int64_t bytes = 0;
    int64_t mismatched_layers = 0;
    // The small synthetic layers (those not 4096 x 16384) are kept and compared in fp32.
    const RandomLayer* checked = nullptr;
    int64_t compared = 0;
    std::vector<uint8_t> current;
    auto check_current = [&] {
      if (checked == nullptr) return;
      if (current != checked->Expected(DType::kF32)) ++mismatched_layers;
      ++compared;
      checked = nullptr;
    };
    LayersSink sink;
    sink.on_header = [&](const v1::DequantizeHeader& header) {
      check_current();
      current.clear();
      for (const RandomLayer& l : layers) {
        if (l.name == header.tensor() && l.shape.K != 4096 && dtype == v1::DTYPE_FP32) checked = &l;
      }
      return absl::OkStatus();
    };
    sink.on_chunk = [&](int64_t, absl::Span<const uint8_t> data) {
      bytes += static_cast<int64_t>(data.size());
      if (checked != nullptr) current.insert(current.end(), data.begin(), data.end());
      return absl::OkStatus();
    };
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<v1::DequantizeHeader>> headers = client.DequantizeLayers(all, sink);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    check_current();
    ASSERT_TRUE(headers.ok()) << headers.status();
    EXPECT_EQ(static_cast<int>(headers->size()), list->tensors_size());
    int64_t expected = 0;
    for (const v1::DequantizeHeader& h : *headers) expected += h.total_bytes();
    EXPECT_EQ(bytes, expected);
    EXPECT_EQ(mismatched_layers, 0);
    if (!layers.empty() && dtype == v1::DTYPE_FP32) {
      EXPECT_EQ(compared, 40);
    }
    std::printf("whole model %s: %d layers, %.3f GB in %.2f s, %.2f GB/s (through gRPC)\n",
                v1::DType_Name(dtype).c_str(), list->tensors_size(), bytes * 1e-9, seconds,
                bytes * 1e-9 / seconds);
  }

  v1::BenchmarkRequest bench;
  bench.add_tensors(first);
  bench.add_variants("v4_vec16");
  bench.set_trials(1);
  bench.set_runs(2);
  absl::StatusOr<v1::BenchmarkResponse> benchmark = client.Benchmark(bench);
  ASSERT_TRUE(benchmark.ok()) << benchmark.status();
  ASSERT_GE(benchmark->rows_size(), 1);
  EXPECT_TRUE(benchmark->rows(0).correct());

  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const int status = WaitFor(pid, 120);
  const std::string output = ReadFile(log);
  ASSERT_NE(status, -1) << "dequantd did not exit within 120 s of SIGTERM\n" << output;
  EXPECT_TRUE(WIFEXITED(status)) << "dequantd ended by signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << "\n"
                                 << output;
  if (WIFEXITED(status)) {
    EXPECT_EQ(WEXITSTATUS(status), 0) << output;
  }
  EXPECT_THAT(output, ::testing::HasSubstr("dequantd stopped"));
}

}  // namespace
}  // namespace dequantd::testing
