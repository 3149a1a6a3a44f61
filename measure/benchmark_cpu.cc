// The CPU backend of the benchmark: variants "cpu_reference" (DequantizeReference) and
// "cpu_threads" (DequantizeCpu), timed with std::chrono::steady_clock; the yardstick (the peak
// and the "copy" row) is memcpy split over the threads of cpu_threads.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/dequant.h"
#include "kernels/run_parts.h"
#include "measure/backends.h"
#include "measure/method.h"

namespace dequantd::bench {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Copies below this many bytes per thread use fewer threads (thread start-up would dominate).
constexpr int64_t kMinCopyBytesPerThread = 16 << 10;

// The threads a `bytes` copy uses when `threads` are allowed: at least 1.
int CopyThreads(int64_t bytes, int threads) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(threads, bytes / kMinCopyBytesPerThread)));
}

// memcpy of `bytes` from `src` to `dst` in CopyThreads(bytes, threads) contiguous slices (64-byte
// aligned boundaries), one per thread (RunParts, as DequantizeCpu).
void ParallelCopy(uint8_t* dst, const uint8_t* src, int64_t bytes, int threads) {
  const int n = CopyThreads(bytes, threads);
  const int64_t slice = (bytes / n + 63) / 64 * 64;
  RunParts(n, [=](int64_t i) {
    const int64_t begin = std::min(bytes, i * slice);
    const int64_t end = i == n - 1 ? bytes : std::min(bytes, begin + slice);
    std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin));
  });
}

// Peak copy rate: median of 3 timed ParallelCopy of `bytes` with `threads` threads, the count of
// the cpu_threads variant (after one warm-up), read + written.
double MeasureCopyPeak(int64_t bytes, int threads) {
  std::vector<uint8_t> src(static_cast<size_t>(bytes), 0x5A), dst(static_cast<size_t>(bytes));
  ParallelCopy(dst.data(), src.data(), bytes, threads);
  std::vector<double> t;
  for (int i = 0; i < 3; ++i) {
    const Clock::time_point start = Clock::now();
    ParallelCopy(dst.data(), src.data(), bytes, threads);
    t.push_back(SecondsSince(start));
  }
  const double median = ComputeStats(t).median;
  return median > 0 ? 2.0 * static_cast<double>(bytes) / median : 0;
}

using DequantFn = std::function<absl::Status(const QuantView&, DType, int64_t, int64_t, void*)>;

// An uninitialized host buffer of `bytes` (no page is touched here): RESOURCE_EXHAUSTED naming
// `what` when it cannot be had.
absl::StatusOr<std::unique_ptr<uint8_t[]>> AllocateHost(int64_t bytes, const char* what) {
  std::unique_ptr<uint8_t[]> p(new (std::nothrow) uint8_t[static_cast<size_t>(bytes)]);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory for the ", what));
  }
  return p;
}

// memset of `bytes` at `p` to `value` in slices of kCancelPollBytes, polling `cancelled` before
// each: CANCELLED as soon as it fires.
absl::Status FillPolling(uint8_t* p, int64_t bytes, uint8_t value,
                         const std::function<bool()>& cancelled) {
  for (int64_t at = 0; at < bytes; at += kCancelPollBytes) {
    if (absl::Status c = CheckCancelled(cancelled); !c.ok()) return c;
    std::memset(p + at, value, static_cast<size_t>(std::min(kCancelPollBytes, bytes - at)));
  }
  return absl::OkStatus();
}

// A CPU dequantization path writing the whole (K, N) output into `out` (output_bytes, shared by
// every runner of one (shape, dtype): runners run one at a time and CheckOutput recomputes).
class CpuDequantRunner : public Runner {
 public:
  CpuDequantRunner(std::string variant, const QuantView& in, DType out_dtype, DequantFn fn,
                   std::string launch_config, uint8_t* out)
      : Runner(std::move(variant), in.shape.bytes_moved(out_dtype), std::move(launch_config)),
        in_(in),
        out_dtype_(out_dtype),
        fn_(std::move(fn)),
        out_(out) {}

  absl::StatusOr<double> LatencySeconds() override {
    const Clock::time_point start = Clock::now();
    if (absl::Status s = fn_(in_, out_dtype_, 0, in_.shape.result_rows(), out_); !s.ok()) return s;
    return SecondsSince(start);
  }

  absl::StatusOr<bool> CheckOutput(const OutputChecker& checker,
                                   const std::vector<RowRange>& rows) override {
    // Poison: a path that writes nothing fails.
    std::memset(out_, 0xFF, static_cast<size_t>(in_.shape.output_bytes(out_dtype_)));
    if (absl::Status s = fn_(in_, out_dtype_, 0, in_.shape.result_rows(), out_); !s.ok()) return s;
    for (const RowRange& r : rows) {
      absl::StatusOr<bool> ok = checker.Matches(r, out_ + r.first * checker.row_bytes());
      if (!ok.ok() || !*ok) return ok;
    }
    return true;
  }

 private:
  QuantView in_;
  DType out_dtype_;
  DequantFn fn_;
  uint8_t* out_;  // not owned
};

// The "copy" row: ParallelCopy with the threads of the cpu_threads variant, like the peak, from
// its own source into `dst` (the shared output buffer, at least copy_bytes long).
class CpuCopyRunner : public Runner {
 public:
  CpuCopyRunner(int64_t copy_bytes, int threads, std::unique_ptr<uint8_t[]> src, uint8_t* dst)
      : Runner("copy", 2 * copy_bytes, absl::StrCat("threads=", CopyThreads(copy_bytes, threads))),
        copy_bytes_(copy_bytes),
        threads_(threads),
        src_(std::move(src)),
        dst_(dst) {}

  absl::StatusOr<double> LatencySeconds() override {
    const Clock::time_point start = Clock::now();
    ParallelCopy(dst_, src_.get(), copy_bytes_, threads_);
    return SecondsSince(start);
  }
  absl::StatusOr<bool> CheckOutput(const OutputChecker&, const std::vector<RowRange>&) override {
    return true;
  }

 private:
  int64_t copy_bytes_;
  int threads_;
  std::unique_ptr<uint8_t[]> src_;
  uint8_t* dst_;  // not owned
};

}  // namespace

absl::StatusOr<BenchmarkResult> RunCpuBenchmark(const BenchmarkRequest& request) {
  absl::StatusOr<std::vector<std::string>> variants =
      SelectVariants(request.variants, {"cpu_reference", "cpu_threads"});
  if (!variants.ok()) return variants.status();
  const int threads = request.cpu_threads > 0
                          ? request.cpu_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));

  BenchmarkResult result;
  result.backend = "cpu";
  result.device = absl::StrCat("CPU (", std::thread::hardware_concurrency(), " hardware threads)");
  if (request.hardware_counters) result.note = "hardware counters are not collected on the CPU";
  result.peak_copy_bytes_per_second = MeasureCopyPeak(request.peak_copy_bytes, threads);

  std::mt19937_64 rng(request.seed);
  MethodOptions options;
  options.trials = request.trials;
  options.runs = request.runs;
  options.sampled_rows = request.sampled_rows;
  options.cancelled = request.cancelled;
  options.peak_copy_bytes_per_second = result.peak_copy_bytes_per_second;
  for (const BenchmarkShape& s : request.shapes) {
    if (absl::Status c = CheckCancelled(request.cancelled); !c.ok()) return c;
    const QuantShape shape = QuantShapeOf(s);
    absl::StatusOr<HostPackedTensor> host = MakeRandomPackedTensor(shape, rng(), request.cancelled);
    if (!host.ok()) return host.status();
    for (DType out : request.output_dtypes) {
      if (absl::Status c = CheckCancelled(request.cancelled); !c.ok()) return c;
      absl::StatusOr<OutputChecker> checker =
          OutputChecker::Create(host->view(), out, request.full_check_max_elements);
      if (!checker.ok()) return checker.status();
      // One output for every variant, also the copy's destination (RunBenchmark checked that it
      // and the copy source fit the host budget: BenchmarkHostBytes).
      const int64_t copy_bytes = CopyBytesFor(shape.bytes_moved(out));
      if (absl::Status c = CheckCancelled(request.cancelled); !c.ok()) return c;
      absl::StatusOr<std::unique_ptr<uint8_t[]>> output =
          AllocateHost(std::max(shape.output_bytes(out), copy_bytes), "benchmark output");
      if (!output.ok()) return output.status();
      std::vector<std::unique_ptr<Runner>> owned;
      for (const std::string& v : *variants) {
        if (v == "cpu_reference") {
          owned.push_back(std::make_unique<CpuDequantRunner>(
              v, host->view(), out, DequantizeReference, "threads=1", output->get()));
        } else {
          owned.push_back(std::make_unique<CpuDequantRunner>(
              v, host->view(), out,
              [threads](const QuantView& in, DType o, int64_t b, int64_t e, void* p) {
                return DequantizeCpu(in, o, b, e, p, threads);
              },
              absl::StrCat("threads=", threads), output->get()));
        }
      }
      if (absl::Status c = CheckCancelled(request.cancelled); !c.ok()) return c;
      absl::StatusOr<std::unique_ptr<uint8_t[]>> copy_src = AllocateHost(copy_bytes, "copy source");
      if (!copy_src.ok()) return copy_src.status();
      if (absl::Status f = FillPolling(copy_src->get(), copy_bytes, 0x5A, request.cancelled);
          !f.ok()) {
        return f;
      }
      owned.push_back(std::make_unique<CpuCopyRunner>(copy_bytes, threads, *std::move(copy_src),
                                                      output->get()));
      if (absl::Status s = RunMethodAppend(owned, shape, out, *checker, options, rng, &result.rows);
          !s.ok())
        return s;
    }
  }
  return result;
}

}  // namespace dequantd::bench
