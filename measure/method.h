// The backend-independent part of the benchmark method: warm-up, trials x runs in shuffled
// order, throughput per trial, output checks, and the rows. Backends (benchmark_cpu.cc,
// benchmark_cuda.cu) supply one Runner per variant. Internal to bench/.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "measure/benchmark.h"
#include "measure/packed_inputs.h"

namespace dequantd::bench {

// One timed thing (a kernel variant, a CPU path, the copy) on one (shape, dtype).
class Runner {
 public:
  Runner(std::string variant, int64_t bytes_moved, std::string launch_config = "")
      : variant_(std::move(variant)),
        bytes_moved_(bytes_moved),
        launch_config_(std::move(launch_config)) {}
  virtual ~Runner() = default;

  const std::string& variant() const { return variant_; }
  int64_t bytes_moved() const { return bytes_moved_; }
  const std::string& launch_config() const { return launch_config_; }

  // Seconds of one call, timed alone.
  virtual absl::StatusOr<double> LatencySeconds() = 0;
  // Seconds per call of many back-to-back calls; 0 when the backend does not measure it.
  virtual absl::StatusOr<double> ThroughputSeconds() { return 0.0; }
  // Runs once more into a poisoned output and compares `rows` with the reference. Runners that
  // compute no dequantization (the copy) return true without checking.
  virtual absl::StatusOr<bool> CheckOutput(const OutputChecker& checker,
                                           const std::vector<RowRange>& rows) = 0;

 private:
  std::string variant_;
  int64_t bytes_moved_;
  std::string launch_config_;
};

struct MethodOptions {
  int trials = 5;
  int runs = 20;
  int warmup_runs = 3;   // untimed latency calls per runner before the trials
  int sampled_rows = 8;  // see OutputChecker::PickRows
  double peak_copy_bytes_per_second = 0;
  std::function<bool()> cancelled;  // BenchmarkRequest::cancelled; empty = never
};

// CANCELLED "benchmark cancelled" when `cancelled` is set and returns true, else OK.
absl::Status CheckCancelled(const std::function<bool()>& cancelled);

// Runs the trials over `runners` and returns one row per runner (in the runners' order), with
// K, N, group_size, output_dtype taken from `shape` and `out_dtype`. options.cancelled is polled
// before every runner call: CANCELLED (CheckCancelled) as soon as it fires.
absl::StatusOr<std::vector<BenchmarkRow>> RunMethod(const std::vector<Runner*>& runners,
                                                    const QuantShape& shape, DType out_dtype,
                                                    const OutputChecker& checker,
                                                    const MethodOptions& options,
                                                    std::mt19937_64& rng);

// RunMethod over owned runners, appending its rows to `*rows`. Errors: as RunMethod.
absl::Status RunMethodAppend(const std::vector<std::unique_ptr<Runner>>& runners,
                             const QuantShape& shape, DType out_dtype, const OutputChecker& checker,
                             const MethodOptions& options, std::mt19937_64& rng,
                             std::vector<BenchmarkRow>* rows);

// The byte count of the "copy" row for a layer moving `bytes_moved`: half of it (the copy reads
// and writes), rounded down to a multiple of 16.
inline int64_t CopyBytesFor(int64_t bytes_moved) { return bytes_moved / 2 / 16 * 16; }

}  // namespace dequantd::bench
