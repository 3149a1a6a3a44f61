#include "measure/benchmark.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/dequant.h"
#include "kernels/format_checks.h"
#include "kernels/format_registry.h"
#include "measure/backends.h"
#include "measure/memory_budget.h"
#include "measure/method.h"

namespace dequantd::bench {

QuantShape QuantShapeOf(const BenchmarkShape& s) {
  QuantShape shape{s.K, s.N, s.group_size, s.scale_dtype};
  shape.format = s.format;
  shape.orientation = FormatRowOf(s.format).default_orientation;
  shape.experts = s.experts;
  return shape;
}

std::vector<BenchmarkShape> DefaultShapes() {
  return {
      {1536, 1536}, {1536, 8960},  {8960, 1536},   // Qwen2.5-1.5B
      {4096, 4096}, {4096, 14336}, {14336, 4096},  // Llama-3-8B
      {8192, 8192}, {8192, 28672}, {28672, 8192},  // Llama-3-70B
  };
}

absl::StatusOr<std::vector<std::string>> SelectVariants(const std::vector<std::string>& requested,
                                                        const std::vector<std::string>& offered) {
  if (requested.empty()) return offered;
  std::vector<std::string> selected;
  for (const std::string& v : requested) {
    if (v == "copy") continue;
    if (std::find(offered.begin(), offered.end(), v) == offered.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown variant \"", v,
                       "\"; this backend offers: ", absl::StrJoin(offered, ", "), ", copy"));
    }
    if (std::find(selected.begin(), selected.end(), v) == selected.end()) selected.push_back(v);
  }
  return selected;
}

namespace {

// RESOURCE_EXHAUSTED (MemoryExhausted) for the first (shape, dtype) of the normalized request
// whose BenchmarkHostBytes exceed the host budget; on the CPU also when the peak-copy buffers
// (2 x peak_copy_bytes) do. OK when the budget is unknown.
absl::Status CheckHostMemory(const BenchmarkRequest& r, bool cuda) {
  const int64_t budget = HostMemoryBudget(r.host_memory_limit_bytes);
  if (budget <= 0) return absl::OkStatus();
  const std::string budget_what =
      r.host_memory_limit_bytes > 0 ? "host_memory_limit_bytes" : "half of the host's MemAvailable";
  if (!cuda && 2 * r.peak_copy_bytes > budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the benchmark's peak copy needs ", 2 * r.peak_copy_bytes,
        " bytes of host memory, more than the ", budget, " bytes available (", budget_what, ")"));
  }
  for (const BenchmarkShape& s : r.shapes) {
    const QuantShape shape = QuantShapeOf(s);
    for (DType out : r.output_dtypes) {
      const HostBytes b = BenchmarkHostBytes(shape, out, r.full_check_max_elements, cuda);
      if (b.total() > budget) {
        return MemoryExhausted(
            shape, out, "host memory", b.total(),
            absl::StrCat("inputs ", b.inputs, ", reference ", b.reference,
                         cuda ? ", checked rows " : ", output and copy buffers ", b.outputs),
            budget, budget_what);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BenchmarkResult> RunBenchmark(const BenchmarkRequest& request) {
  BenchmarkRequest r = request;
  if (r.shapes.empty()) return absl::InvalidArgumentError("no shapes to benchmark");
  if (r.group_size < 0) return absl::InvalidArgumentError("group_size must be >= 0");
  if (r.group_size == 0) r.group_size = 128;
  if (r.trials == 0) r.trials = 5;
  if (r.runs == 0) r.runs = 20;
  if (r.trials < 0 || r.trials > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("trials must be in [1, 1000], got ", r.trials));
  }
  if (r.runs < 0 || r.runs > 10000) {
    return absl::InvalidArgumentError(absl::StrCat("runs must be in [1, 10000], got ", r.runs));
  }
  if (r.sampled_rows < 0) return absl::InvalidArgumentError("sampled_rows must be >= 0");
  if (r.output_dtypes.empty()) r.output_dtypes = {DType::kF16};
  if (r.seed == 0) r.seed = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  for (BenchmarkShape& s : r.shapes) {
    if (s.group_size == 0) s.group_size = r.group_size;
    const QuantShape shape = QuantShapeOf(s);
    for (DType out : r.output_dtypes) {
      if (absl::Status st = ValidateShape(shape, out); !st.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("shape ", AbslView(FormatName(s.format)), " ",
                         s.experts != 1 ? absl::StrCat(s.experts, "x") : "", s.K, "x", s.N,
                         " group_size ", s.group_size, ": ", st.message()));
      }
    }
  }
  if (absl::Status c = CheckCancelled(r.cancelled); !c.ok()) return c;
  Backend backend = r.backend;
  if (backend == Backend::kAuto) {
    backend = CudaDeviceAvailable(r.device) ? Backend::kCuda : Backend::kCpu;
  }
  if (backend == Backend::kCuda) {
    if (!CudaDeviceAvailable(r.device)) {
      return absl::FailedPreconditionError(
          absl::StrCat("no CUDA device ", r.device, " (or this build has no CUDA)"));
    }
    if (r.peak_copy_bytes == 0) r.peak_copy_bytes = int64_t{1} << 30;
    if (absl::Status m = CheckHostMemory(r, /*cuda=*/true); !m.ok()) return m;
    return RunCudaBenchmark(r);
  }
  if (r.peak_copy_bytes == 0) r.peak_copy_bytes = int64_t{256} << 20;
  if (absl::Status m = CheckHostMemory(r, /*cuda=*/false); !m.ok()) return m;
  return RunCpuBenchmark(r);
}

}  // namespace dequantd::bench
