// How much memory a benchmark (measure/benchmark.h) allocates for one (shape, output dtype), and
// the check that it fits what the host (or the CUDA device) can give, made before allocating.
// Internal to bench/. Thread-safe (no state).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/dequant.h"

namespace dequantd::bench {

// The host bytes one (shape, out_dtype) of a benchmark holds at once:
//   inputs: every stored tensor, QuantShape::packed_bytes (MakeRandomPackedTensor; AWQ: qweight +
//     qzeros + scales);
//   reference: the whole reference output when (E *) K * N <= full_check_max_elements
//     (OutputChecker), else one row (sampled-row check);
//   CPU backend (`cuda` false): one buffer of max(output bytes, C) shared by the variants and
//     written by the copy row, plus the copy row's source of C = CopyBytesFor(bytes_moved) bytes;
//   CUDA backend (`cuda` true): the host copy of the checked rows (all rows when the reference is
//     whole, else one row).
struct HostBytes {
  int64_t inputs = 0;
  int64_t reference = 0;
  int64_t outputs = 0;  // CPU: output + copy source; CUDA: checked rows
  int64_t total() const { return inputs + reference + outputs; }
};
HostBytes BenchmarkHostBytes(const QuantShape& shape, DType out_dtype,
                             int64_t full_check_max_elements, bool cuda);

// The host bytes a benchmark may allocate: `limit_bytes` when > 0, else half of the host's
// available memory (/proc/meminfo MemAvailable, or sysconf(_SC_AVPHYS_PAGES) * page size when
// that cannot be read); 0 when neither can be read (unknown: callers do not check).
int64_t HostMemoryBudget(int64_t limit_bytes);

// RESOURCE_EXHAUSTED "benchmark shape KxN (group_size G, <dtype> output) needs <needed> bytes of
// <memory> (<detail>), more than the <available> bytes available (<available_what>)".
absl::Status MemoryExhausted(const QuantShape& shape, DType out_dtype, const std::string& memory,
                             int64_t needed, const std::string& detail, int64_t available,
                             const std::string& available_what);

}  // namespace dequantd::bench
