// scaleout_driver: drives Dequantize calls through one DequantClient (one gRPC channel) from
// several threads ("streams"), as a client of several dequantd replicas would, and counts what
// happened. tests/scaleout/scaleout_test.py runs it; it is not a benchmark with a method
// (bench/ is), only a load generator whose counters a test can check.
//
//   scaleout_driver --server TARGET [--lb round_robin] --tensor LAYER --expect RAW_FILE
//                   --streams S (--calls_per_stream N | --calls_per_stream 0)
//
// absl spells the flags with '_'. Every call asks for LAYER as fp16; its bytes must equal
// RAW_FILE (the row-major (K, N) fp16 result, computed independently). A call that fails with
// UNAVAILABLE (a replica that went away while the call was in flight) is retried after a short
// pause, at most twice; other failures are not retried. With --calls_per_stream 0 the streams run
// until stdin reaches end of file, and a progress line "progress ok=N" is printed whenever the
// count of successful calls reaches a multiple of 20. At the end one JSON line:
//   {"ok":N,"unavailable":U,"retried_ok":R,"failed":F,"mismatched":M,"seconds":T,"bytes":B}
// ok: calls that returned the expected bytes (first try or retry); unavailable: attempts that
// ended UNAVAILABLE; retried_ok: calls that succeeded on a retry; failed: calls that failed for
// good (any code other than UNAVAILABLE, or UNAVAILABLE on every attempt); mismatched: calls whose
// bytes differed. Exit status: 0 when failed == 0 and mismatched == 0, 1 otherwise, 2 usage error.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"

ABSL_FLAG(std::string, server, "", "gRPC target, e.g. ipv4:127.0.0.1:P,127.0.0.2:P");
ABSL_FLAG(std::string, lb, "", "load-balancing policy: empty (pick_first) or round_robin");
ABSL_FLAG(std::string, tensor, "", "layer of the loaded model to dequantize (fp16)");
ABSL_FLAG(std::string, expect, "", "file with the expected raw row-major fp16 bytes");
ABSL_FLAG(int, streams, 1, "concurrent callers, 1..256");
ABSL_FLAG(int, calls_per_stream, 0, "calls per stream; 0 = until stdin reaches end of file");
ABSL_FLAG(double, deadline, 60, "per-call deadline, seconds");

namespace {

struct Counters {
  std::atomic<int64_t> ok{0}, unavailable{0}, retried_ok{0}, failed{0}, mismatched{0}, bytes{0};
};

// Attempts per call: a call that fails with UNAVAILABLE is tried again, after a short pause, up to
// this many times in all.
constexpr int kAttempts = 3;

// One call, retried on UNAVAILABLE. Counts into `counters`.
void CallOnce(dequantd::DequantClient& client, const dequantd::v1::DequantizeRequest& request,
              const std::vector<uint8_t>& expected, Counters& counters, std::mutex& log_mutex) {
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    if (attempt > 0) {
      // A retry sent at once may be picked for the replica that just went away, before the
      // channel has seen its connection close; a pause of 20 ms, then 40 ms, lets it see that.
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * attempt));
    }
    absl::StatusOr<dequantd::DequantizedTensor> result = client.DequantizeToMemory(request);
    if (result.ok()) {
      if (result->data != expected) {
        ++counters.mismatched;
        return;
      }
      ++counters.ok;
      counters.bytes += static_cast<int64_t>(result->data.size());
      if (attempt > 0) ++counters.retried_ok;
      return;
    }
    const bool unavailable = absl::IsUnavailable(result.status());
    if (unavailable) ++counters.unavailable;
    {
      std::lock_guard<std::mutex> lock(log_mutex);
      std::cerr << "scaleout_driver: attempt " << attempt + 1 << ": "
                << absl::StatusCodeToString(result.status().code()) << ": "
                << result.status().message() << std::endl;
    }
    if (!unavailable) break;
  }
  ++counters.failed;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int streams = absl::GetFlag(FLAGS_streams);
  const int calls_per_stream = absl::GetFlag(FLAGS_calls_per_stream);
  if (absl::GetFlag(FLAGS_server).empty() || absl::GetFlag(FLAGS_tensor).empty() ||
      absl::GetFlag(FLAGS_expect).empty() || streams < 1 || streams > 256 || calls_per_stream < 0) {
    std::cerr << "scaleout_driver: --server, --tensor, --expect and --streams 1..256 are needed\n";
    return 2;
  }
  std::ifstream in(absl::GetFlag(FLAGS_expect), std::ios::binary);
  const std::vector<uint8_t> expected((std::istreambuf_iterator<char>(in)),
                                      std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    std::cerr << "scaleout_driver: cannot read --expect " << absl::GetFlag(FLAGS_expect) << "\n";
    return 2;
  }

  dequantd::ClientOptions options;
  options.lb_policy = absl::GetFlag(FLAGS_lb);
  options.deadline_seconds = absl::GetFlag(FLAGS_deadline);
  absl::StatusOr<std::unique_ptr<dequantd::DequantClient>> client =
      dequantd::DequantClient::Connect(absl::GetFlag(FLAGS_server), options);
  if (!client.ok()) {
    std::cerr << "scaleout_driver: " << client.status() << "\n";
    return 2;
  }
  dequantd::v1::DequantizeRequest request;
  request.set_tensor(absl::GetFlag(FLAGS_tensor));
  request.set_output_dtype(dequantd::v1::DTYPE_FP16);

  Counters counters;
  std::mutex log_mutex;
  std::atomic<bool> stop{false};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&] {
      for (int i = 0; calls_per_stream == 0 ? !stop.load() : i < calls_per_stream; ++i) {
        CallOnce(**client, request, expected, counters, log_mutex);
        const int64_t ok = counters.ok.load();
        if (calls_per_stream == 0 && ok % 20 == 0) {
          std::lock_guard<std::mutex> lock(log_mutex);
          std::cout << "progress ok=" << ok << std::endl;
        }
      }
    });
  }
  if (calls_per_stream == 0) {
    char buffer[256];
    while (::read(STDIN_FILENO, buffer, sizeof(buffer)) > 0) {
    }
    stop = true;
  }
  for (std::thread& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << absl::StrCat("{\"ok\":", counters.ok.load(),
                            ",\"unavailable\":", counters.unavailable.load(),
                            ",\"retried_ok\":", counters.retried_ok.load(),
                            ",\"failed\":", counters.failed.load(),
                            ",\"mismatched\":", counters.mismatched.load(),
                            ",\"seconds\":", seconds, ",\"bytes\":", counters.bytes.load(), "}")
            << std::endl;
  return counters.failed.load() == 0 && counters.mismatched.load() == 0 ? 0 : 1;
}
