// Renders a BenchmarkResult as the table dequantd_bench prints (plain text or Markdown for
// docs/performance.md).
#pragma once

#include <string>

#include "measure/benchmark.h"

namespace dequantd::bench {

struct TableHeader {
  std::string date;    // e.g. "2026-11-30 08:00 UTC"
  std::string commit;  // e.g. "8d73c26"; omitted when empty
};

// Columns: variant, shape (K x N, g), dtype, latency median (us), latency mean/std (us),
// throughput (us/launch), GB/s and % of peak copy for latency and throughput, divergent, correct,
// launch config. Above the table: device, backend, date, commit, peak copy rate and the note.
// GB = 1e9 bytes.
std::string FormatTable(const BenchmarkResult& result, const TableHeader& header, bool markdown);

}  // namespace dequantd::bench
