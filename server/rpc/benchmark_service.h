// The Benchmark RPC's core: dequant.v1.BenchmarkRequest -> bench::BenchmarkRequest (limits,
// defaults, model layers), the benchmark library (measure/benchmark.h) run one call at a time,
// and bench::BenchmarkResult -> dequant.v1.BenchmarkResponse. The service's handler stays thin
// (service.h: BenchmarkRunner).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "dequant/v1/dequant.pb.h"
#include "measure/benchmark.h"
#include "server/model/checkpoint.h"
#include "server/rpc/service.h"

namespace dequantd {

// Request limits (INVALID_ARGUMENT naming the field beyond them).
inline constexpr int kMaxBenchmarkTrials = 100;
inline constexpr int kMaxBenchmarkRuns = 1000;
inline constexpr int kMaxBenchmarkShapes = 64;    // shapes + tensors
inline constexpr int kMaxBenchmarkVariants = 16;  // requested variant names

// Defaults for trials/runs of 0 on the CPU backend (CUDA: the library's, 5 and 20): the CPU paths
// are slow, and CI benchmarks the CPU backend.
inline constexpr int kCpuDefaultTrials = 3;
inline constexpr int kCpuDefaultRuns = 5;

struct BenchmarkServiceOptions {
  std::string backend = "cpu";  // the server's backend: "cpu" or "cuda" (selects bench::Backend)
  int cpu_threads = 0;          // the cpu_threads variant's threads; 0 = hardware concurrency
  int64_t max_output_bytes = int64_t{16} << 30;  // largest K * N * sizeof(dtype) benchmarked
  const Checkpoint* checkpoint = nullptr;        // for `tensors`; null = no model (not owned)
  Autotuner* autotuner = nullptr;                // CUDA: the server's tuner (not owned); null = a
                                                 // memory-only tuner per call
  // The benchmark itself; null = bench::RunBenchmark. Tests substitute a fake.
  std::function<absl::StatusOr<bench::BenchmarkResult>(const bench::BenchmarkRequest&)> run;
};

// Validates `request` and converts it. Shapes come first, then tensors, in request order.
// Errors: INVALID_ARGUMENT naming the field (shapes[i], group_size, variants, output_dtypes[i],
// trials, runs, hardware limits above, a malformed shape), RESOURCE_EXHAUSTED naming the field
// and max_output_bytes (a valid shape whose output is over the server's limit, as Dequantize),
// NOT_FOUND (tensors[i] is not a layer of the loaded model).
absl::StatusOr<bench::BenchmarkRequest> BenchmarkRequestFromProto(
    const dequant::v1::BenchmarkRequest& request, const BenchmarkServiceOptions& options);

// The reply for `result` (every row field; note = the library's note, preceded by "hardware
// counters not collected: ..." when `hardware_counters` was requested and the library's note does
// not already say why: nothing collects them yet, issue 4).
dequant::v1::BenchmarkResponse BenchmarkResponseToProto(const bench::BenchmarkResult& result,
                                                        bool hardware_counters);

// The service's BenchmarkRunner: converts, runs, converts back. One benchmark at a time per
// runner: a call while another runs returns RESOURCE_EXHAUSTED "a benchmark is already running"
// at once (rather than holding a gRPC thread for the length of someone else's benchmark). A
// call whose client goes away (deadline exceeded, cancelled, disconnected) stops within one timed
// call (grpc::ServerContext::IsCancelled is passed as bench::BenchmarkRequest::cancelled) and
// returns CANCELLED "benchmark cancelled", releasing the runner for the next call. `options`'
// pointers must outlive the runner.
BenchmarkRunner MakeBenchmarkRunner(BenchmarkServiceOptions options);

}  // namespace dequantd
