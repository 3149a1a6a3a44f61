#include "measure/benchmark.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/compressed_tensors_format.h"
#include "kernels/compressed_tensors_fp8_format.h"
#include "kernels/dequant.h"
#include "kernels/format_registry.h"
#include "kernels/fp8_block_format.h"
#include "kernels/gptq_format.h"
#include "kernels/mxfp4_format.h"
#include "measure/backends.h"
#include "measure/memory_budget.h"
#include "measure/method.h"

namespace dequantd::bench {

QuantShape ToQuantShape(const BenchmarkShape& s) {
  QuantShape shape{s.K, s.N, s.group_size, s.scale_dtype};
  shape.format = s.format;
  shape.orientation = s.orientation.value_or(FormatRowOf(s.format).default_orientation);
  shape.bits = s.bits;
  shape.format_flags = s.format_flags;
  shape.scale_block_rows = s.scale_block_rows;
  shape.experts = s.experts;
  return shape;
}

BenchmarkShape FromQuantShape(const QuantShape& shape) {
  BenchmarkShape s{shape.K, shape.N, shape.group_size, shape.scale_dtype};
  s.format = shape.format;
  s.bits = shape.bits;
  s.format_flags = shape.format_flags;
  s.scale_block_rows = shape.scale_block_rows;
  s.experts = shape.experts;
  s.orientation = shape.orientation;
  return s;
}

BenchmarkShape PresetShape(Format format, int64_t K, int64_t N, int64_t group_size,
                           int64_t experts) {
  if (group_size == 0) group_size = 128;
  BenchmarkShape s{K, N, group_size, DType::kF16};
  s.format = format;
  switch (format) {
    case Format::kAwqGemm:
      break;
    case Format::kGptq:
      s.format_flags = gptq::kZerosV1;  // g_idx stored (act-order), asymmetric
      break;
    case Format::kCompressedTensors:
      s.scale_dtype = DType::kBF16;
      s.format_flags = compressed_tensors::kSym | compressed_tensors::kNoGidx;
      break;
    case Format::kFp8Block:
      s = FromQuantShape(fp8_block::MakeShape(K, N, DType::kF32));
      break;
    case Format::kCompressedTensorsFp8:
      s = FromQuantShape(compressed_tensors_fp8::MakeShape(K, N, 1, K, DType::kBF16));
      break;
    case Format::kMxfp4:
      s = FromQuantShape(mxfp4::MakeShape(K, N, experts));
      break;
  }
  s.orientation.reset();  // the format's own
  return s;
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
    const QuantShape shape = ToQuantShape(s);
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
    const QuantShape shape = ToQuantShape(s);
    for (DType out : r.output_dtypes) {
      if (absl::Status st = ValidateShape(shape, out); !st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shape ", FormatLabel(shape), " ", s.experts != 1 ? absl::StrCat(s.experts, "x") : "",
            s.K, "x", s.N, " group_size ", s.group_size, ": ", st.message()));
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
