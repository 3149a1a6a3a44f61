// Memory estimates and budgets of the benchmark (see memory_budget.h).
#include "measure/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "measure/method.h"

namespace dequantd::bench {
namespace {

// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read.
int64_t MemAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace

HostBytes BenchmarkHostBytes(const QuantShape& shape, DType out_dtype,
                             int64_t full_check_max_elements, bool cuda) {
  const int64_t output = shape.output_bytes(out_dtype);
  const int64_t row = shape.result_cols() * DTypeSize(out_dtype);
  const bool full = shape.output_elements() <= full_check_max_elements;
  HostBytes b;
  b.inputs = shape.packed_bytes();
  b.reference = full ? output : row;
  const int64_t copy = CopyBytesFor(shape.bytes_moved(out_dtype));
  b.outputs = cuda ? (full ? output : row) : std::max(output, copy) + copy;
  return b;
}

int64_t HostMemoryBudget(int64_t limit_bytes) {
  if (limit_bytes > 0) return limit_bytes;
  int64_t available = MemAvailableBytes();
  if (available <= 0) {
    const long pages = sysconf(_SC_AVPHYS_PAGES);
    const long page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) available = static_cast<int64_t>(pages) * page;
  }
  return available > 0 ? available / 2 : 0;
}

absl::Status MemoryExhausted(const QuantShape& shape, DType out_dtype, const std::string& memory,
                             int64_t needed, const std::string& detail, int64_t available,
                             const std::string& available_what) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "benchmark shape ", shape.K, "x", shape.N, " (group_size ", shape.group_size, ", ",
      std::string(DTypeName(out_dtype)), " output) needs ", needed, " bytes of ", memory, " (",
      detail, "), more than the ", available, " bytes available (", available_what, ")"));
}

}  // namespace dequantd::bench
