#include "measure/method.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "kernels/format_registry.h"

namespace dequantd::bench {

absl::Status CheckCancelled(const std::function<bool()>& cancelled) {
  if (cancelled && cancelled()) return absl::CancelledError("benchmark cancelled");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BenchmarkRow>> RunMethod(const std::vector<Runner*>& runners,
                                                    const QuantShape& shape, DType out_dtype,
                                                    const OutputChecker& checker,
                                                    const MethodOptions& options,
                                                    std::mt19937_64& rng) {
  const size_t n = runners.size();
  for (Runner* r : runners) {
    for (int i = 0; i < options.warmup_runs; ++i) {
      if (absl::Status s = CheckCancelled(options.cancelled); !s.ok()) return s;
      if (absl::StatusOr<double> t = r->LatencySeconds(); !t.ok()) return t.status();
    }
  }
  std::vector<std::vector<double>> latency(n), throughput(n);
  std::vector<bool> correct(n, true);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  for (int trial = 0; trial < options.trials; ++trial) {
    for (int run = 0; run < options.runs; ++run) {
      std::shuffle(order.begin(), order.end(), rng);
      for (size_t i : order) {
        if (absl::Status s = CheckCancelled(options.cancelled); !s.ok()) return s;
        absl::StatusOr<double> t = runners[i]->LatencySeconds();
        if (!t.ok()) return t.status();
        latency[i].push_back(*t);
      }
    }
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      if (absl::Status s = CheckCancelled(options.cancelled); !s.ok()) return s;
      absl::StatusOr<double> t = runners[i]->ThroughputSeconds();
      if (!t.ok()) return t.status();
      if (*t > 0) throughput[i].push_back(*t);
    }
    const std::vector<RowRange> rows = checker.PickRows(rng, options.sampled_rows);
    for (size_t i = 0; i < n; ++i) {
      if (absl::Status s = CheckCancelled(options.cancelled); !s.ok()) return s;
      absl::StatusOr<bool> ok = runners[i]->CheckOutput(checker, rows);
      if (!ok.ok()) return ok.status();
      correct[i] = correct[i] && *ok;
    }
  }

  std::vector<BenchmarkRow> out;
  for (size_t i = 0; i < n; ++i) {
    BenchmarkRow row;
    row.variant = runners[i]->variant();
    row.format = shape.format;
    row.experts = shape.experts;
    row.layout = FormatLabel(shape);
    row.orientation = shape.orientation;
    row.K = shape.K;
    row.N = shape.N;
    row.group_size = shape.group_size;
    row.output_dtype = out_dtype;
    row.bytes_moved = runners[i]->bytes_moved();
    row.launch_config = runners[i]->launch_config();
    row.latency = ComputeStats(latency[i]);
    row.throughput_seconds = ComputeStats(throughput[i]).median;
    const double peak = options.peak_copy_bytes_per_second;
    if (row.latency.median > 0) {
      row.bytes_per_second = static_cast<double>(row.bytes_moved) / row.latency.median;
      if (peak > 0) row.fraction_of_peak = row.bytes_per_second / peak;
    }
    if (row.throughput_seconds > 0) {
      row.throughput_bytes_per_second =
          static_cast<double>(row.bytes_moved) / row.throughput_seconds;
      if (peak > 0) row.throughput_fraction_of_peak = row.throughput_bytes_per_second / peak;
    }
    row.correct = correct[i];
    out.push_back(std::move(row));
  }
  return out;
}

absl::Status RunMethodAppend(const std::vector<std::unique_ptr<Runner>>& runners,
                             const QuantShape& shape, DType out_dtype, const OutputChecker& checker,
                             const MethodOptions& options, std::mt19937_64& rng,
                             std::vector<BenchmarkRow>* rows) {
  std::vector<Runner*> raw;
  for (const std::unique_ptr<Runner>& r : runners) raw.push_back(r.get());
  absl::StatusOr<std::vector<BenchmarkRow>> out =
      RunMethod(raw, shape, out_dtype, checker, options, rng);
  if (!out.ok()) return out.status();
  for (BenchmarkRow& row : *out) rows->push_back(std::move(row));
  return absl::OkStatus();
}

}  // namespace dequantd::bench
