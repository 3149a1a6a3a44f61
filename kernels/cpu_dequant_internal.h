// Knobs of DequantizeCpu that tests and benchmarks pin down: the instruction set of the row
// kernel and how work is split across threads. Not part of the public kernels API.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>

#include "absl/status/status.h"
#include "kernels/dequant.h"

namespace dequantd::cpu {

// Row kernel flavour. kAvx2 needs a CPU with AVX2 and F16C (checked at run time).
enum class CpuIsa { kBest, kPortable, kAvx2 };

struct CpuDequantOptions {
  int threads = 0;             // >= 0; 0 = std::thread::hardware_concurrency()
  CpuIsa isa = CpuIsa::kBest;  // kBest: AVX2 when the CPU has it, else portable
  int64_t min_elements_per_thread = int64_t{1} << 16;  // fewer threads for small requests; >= 1
  // AVX2 only: outputs of at least this many bytes, with `out` 16-byte aligned, are written with
  // non-temporal stores (they bypass the cache; about 2x faster for fp32 output). >= 0 bytes.
  int64_t stream_min_bytes = int64_t{32} << 20;
};

// Threads for a job of `rows` result rows of `cols` elements cut into whole-row parts:
// options.threads (0 = hardware concurrency), at most one per min_elements_per_thread elements
// and one per row; at least 1 when rows > 0.
inline int64_t PartsForRows(const CpuDequantOptions& options, int64_t rows, int64_t cols) {
  int64_t threads = options.threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(threads, std::max<int64_t>(1, rows * cols / options.min_elements_per_thread));
  return std::min(threads, rows);
}

// True when this CPU runs the AVX2 + F16C row kernel.
bool CpuHasAvx2();

// DequantizeCpu with every knob exposed. Same contract and result; additionally
// INVALID_ARGUMENT for threads < 0, min_elements_per_thread < 1 or
// stream_min_bytes < 0, and FAILED_PRECONDITION for
// isa = kAvx2 on a CPU without AVX2/F16C. Thread-safe (no shared state).
absl::Status DequantizeCpuWithOptions(const QuantView& in, DType out_dtype, int64_t row_begin,
                                      int64_t row_end, void* out, const CpuDequantOptions& options);

}  // namespace dequantd::cpu
