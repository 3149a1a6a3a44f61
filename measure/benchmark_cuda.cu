// The CUDA backend of the benchmark (compiled only with DEQUANTD_HAVE_CUDA): kernel variants from
// kernels/cuda/dequant_cuda.h timed with CUDA events (latency) and CUDA graphs (throughput) over
// buffer sets rotated to defeat the L2, against a device-to-device cudaMemcpyAsync yardstick.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/autotune.h"
#include "kernels/cuda/autotune_cuda.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dequant_cuda.h"
#include "measure/backends.h"
#include "measure/cuda_timing.h"
#include "measure/hw_counters.h"
#include "measure/memory_budget.h"
#include "measure/method.h"

namespace dequantd::bench {
namespace {

using cuda::KernelVariant;
using cuda::LaunchConfig;

// One copy of the packed inputs plus an output buffer, inside a BufferArena.
struct BufferSet {
  QuantView view;       // device pointers
  void* out = nullptr;  // K * N elements of the output dtype
};

// `sets` carved out of one allocation (each part 256-byte aligned).
struct BufferArena {
  DeviceBuffer memory;
  std::vector<BufferSet> sets;
};

// The most buffer sets one (shape, dtype) uses: tiny layers get fewer than 4x L2 of rotation.
constexpr int64_t kMaxBufferSets = 1024;

// `count` sets holding `host`'s inputs, each with an output of out_bytes.
absl::StatusOr<BufferArena> MakeBufferArena(const HostPackedTensor& host, int64_t out_bytes,
                                            int64_t count) {
  const QuantShape& shape = host.shape;
  const int roles = TensorRoleCount(shape.format);
  std::array<int64_t, kMaxTensorRoles> role_at{};  // each role's offset in a set
  int64_t out_at = 0;
  for (int r = 0; r < roles; ++r) {
    role_at[static_cast<size_t>(r)] = out_at;
    out_at += AlignUp(TensorSpecOf(shape, r).bytes());
  }
  const int64_t stride = out_at + AlignUp(out_bytes);
  BufferArena arena;
  absl::StatusOr<DeviceBuffer> memory = Allocate(stride * count);
  if (!memory.ok()) return memory.status();
  arena.memory = std::move(*memory);
  auto* base = static_cast<uint8_t*>(arena.memory.get());
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* set = base + i * stride;
    BufferSet b;
    b.view.shape = shape;
    for (int r = 0; r < roles; ++r) {
      b.view.tensors[static_cast<size_t>(r)] = set + role_at[static_cast<size_t>(r)];
    }
    b.out = set + out_at;
    arena.sets.push_back(b);
  }
  for (int r = 0; r < roles; ++r) {
    const std::vector<uint8_t>& bytes = host.tensors[static_cast<size_t>(r)];
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpy(base + role_at[static_cast<size_t>(r)], bytes.data(),
                                             bytes.size(), cudaMemcpyHostToDevice));
  }
  for (int64_t i = 1; i < count; ++i) {
    DEQUANTD_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(base + i * stride, base, out_at, cudaMemcpyDeviceToDevice));
  }
  return arena;
}

// RESOURCE_EXHAUSTED (MemoryExhausted) when the `count` buffer sets MakeBufferArena would
// allocate for (shape, out_dtype) exceed the current device's free memory (cudaMemGetInfo).
absl::Status CheckDeviceMemory(const QuantShape& shape, DType out_dtype, int64_t count) {
  size_t free_bytes = 0, total_bytes = 0;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  int64_t stride = AlignUp(shape.output_bytes(out_dtype));
  for (int r = 0; r < TensorRoleCount(shape.format); ++r) {
    stride += AlignUp(TensorSpecOf(shape, r).bytes());
  }
  const int64_t needed = stride * count;
  if (needed <= static_cast<int64_t>(free_bytes)) return absl::OkStatus();
  return MemoryExhausted(shape, out_dtype, "device memory", needed,
                         absl::StrCat(count, " buffer sets of ", stride, " bytes"),
                         static_cast<int64_t>(free_bytes), "free on the device, cudaMemGetInfo");
}

// Target duration of one throughput graph launch, and the bounds on its launch count.
constexpr double kGraphTargetSeconds = 5e-3;
constexpr int kMaxGraphLaunches = 2000;

// A runner that enqueues one call on a buffer set; latency and throughput are timed the same way
// for every kind of call.
class CudaRunner : public Runner {
 public:
  CudaRunner(std::string variant, int64_t bytes_moved, std::string launch_config,
             std::vector<BufferSet>& sets, EventTimer& timing)
      : Runner(std::move(variant), bytes_moved, std::move(launch_config)),
        sets_(sets),
        timing_(timing) {}

  absl::StatusOr<double> LatencySeconds() override {
    const int set = next_;
    next_ = (next_ + 1) % static_cast<int>(sets_.size());
    return timing_.Time([&] { return Enqueue(set); });
  }

  absl::StatusOr<double> ThroughputSeconds() override {
    if (graph_ == nullptr) {
      if (absl::Status s = BuildGraph(); !s.ok()) return s;
    }
    absl::StatusOr<double> t = timing_.Time([&]() -> absl::Status {
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph_.get(), timing_.stream()));
      return absl::OkStatus();
    });
    if (!t.ok()) return t.status();
    return *t / graph_launches_;
  }

 protected:
  // Enqueues one call reading set `set` on the timing stream.
  virtual absl::Status Enqueue(int set) = 0;

  std::vector<BufferSet>& sets_;
  EventTimer& timing_;

 private:
  // Captures enough back-to-back calls, rotating over the sets, for about kGraphTargetSeconds,
  // and launches the graph once (warm-up).
  absl::Status BuildGraph() {
    double estimate = 1e30;
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<double> t = LatencySeconds();
      if (!t.ok()) return t.status();
      estimate = std::min(estimate, *t);
    }
    const int sets = static_cast<int>(sets_.size());
    int launches =
        static_cast<int>(std::clamp(std::ceil(kGraphTargetSeconds / std::max(estimate, 1e-7)), 1.0,
                                    static_cast<double>(kMaxGraphLaunches)));
    launches = std::max(sets, (launches + sets - 1) / sets * sets);

    cudaStream_t stream = timing_.stream();
    absl::StatusOr<GraphExec> graph = CaptureGraph(stream, [&] {
      absl::Status enqueued = absl::OkStatus();
      for (int i = 0; i < launches && enqueued.ok(); ++i) enqueued.Update(Enqueue(i % sets));
      return enqueued;
    });
    if (!graph.ok()) return graph.status();
    graph_ = *std::move(graph);
    graph_launches_ = launches;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph_.get(), stream));
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return absl::OkStatus();
  }

  int next_ = 0;
  GraphExec graph_;
  int graph_launches_ = 0;
};

class KernelRunner : public CudaRunner {
 public:
  KernelRunner(KernelVariant v, const LaunchConfig& config, DType out_dtype,
               std::vector<BufferSet>& sets, EventTimer& timing)
      : CudaRunner(std::string(cuda::VariantName(v)),
                   sets.front().view.shape.bytes_moved(out_dtype), config.ToString(), sets, timing),
        v_(v),
        config_(config),
        out_dtype_(out_dtype) {}

  // Enqueues one call on buffer set 0 on `stream` (hardware counters).
  absl::Status LaunchOnce(cudaStream_t stream) {
    return cuda::LaunchDequantize(v_, config_, sets_.front().view, out_dtype_, sets_.front().out,
                                  stream);
  }

  absl::StatusOr<bool> CheckOutput(const OutputChecker& checker,
                                   const std::vector<RowRange>& rows) override {
    BufferSet& set = sets_.front();
    const QuantShape& shape = set.view.shape;
    cudaStream_t stream = timing_.stream();
    // Poison the output first: a kernel that skips elements cannot pass on stale results.
    DEQUANTD_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(set.out, 0xFF, shape.output_bytes(out_dtype_), stream));
    if (absl::Status s = Enqueue(0); !s.ok()) return s;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    bool all = true;
    for (const RowRange& r : rows) {
      host_.resize(static_cast<size_t>((r.second - r.first) * checker.row_bytes()));
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpy(
          host_.data(), static_cast<const uint8_t*>(set.out) + r.first * checker.row_bytes(),
          host_.size(), cudaMemcpyDeviceToHost));
      absl::StatusOr<bool> ok = checker.Matches(r, host_.data());
      if (!ok.ok()) return ok.status();
      all = all && *ok;
    }
    return all;
  }

 protected:
  absl::Status Enqueue(int set) override {
    return cuda::LaunchDequantize(v_, config_, sets_[set].view, out_dtype_, sets_[set].out,
                                  timing_.stream());
  }

 private:
  KernelVariant v_;
  LaunchConfig config_;
  DType out_dtype_;
  std::vector<uint8_t> host_;
};

// cudaMemcpyAsync of copy_bytes from set i's output buffer to set i+1's.
class CopyRunner : public CudaRunner {
 public:
  CopyRunner(int64_t copy_bytes, std::vector<BufferSet>& sets, EventTimer& timing)
      : CudaRunner("copy", 2 * copy_bytes, "cudaMemcpyAsync D2D", sets, timing),
        copy_bytes_(copy_bytes) {}

  absl::StatusOr<bool> CheckOutput(const OutputChecker&, const std::vector<RowRange>&) override {
    return true;
  }

 protected:
  absl::Status Enqueue(int set) override {
    const int dst = (set + 1) % static_cast<int>(sets_.size());
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sets_[dst].out, sets_[set].out, copy_bytes_,
                                                  cudaMemcpyDeviceToDevice, timing_.stream()));
    return absl::OkStatus();
  }

 private:
  int64_t copy_bytes_;
};

// Fills the counters of each kernel runner's row among rows[first..]. A failure (e.g. the driver
// forbids profiling) is returned for the note; later calls are skipped once one failed.
absl::Status MeasureRowCounters(const std::vector<KernelRunner*>& kernels, cudaStream_t stream,
                                size_t first, std::vector<BenchmarkRow>& rows) {
  for (KernelRunner* k : kernels) {
    absl::StatusOr<std::map<std::string, double>> counters =
        MeasureCounters([k](cudaStream_t s) { return k->LaunchOnce(s); }, stream);
    if (!counters.ok()) return counters.status();
    for (size_t i = first; i < rows.size(); ++i) {
      if (rows[i].variant == k->variant()) rows[i].counters = *counters;
    }
  }
  return absl::OkStatus();
}

std::string DeviceDescription(const cudaDeviceProp& prop, int64_t l2_bytes) {
  return absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", ", prop.multiProcessorCount,
                      " SMs, L2 ", l2_bytes >> 20, " MiB, ", prop.totalGlobalMem >> 30, " GiB)");
}

}  // namespace

bool CudaDeviceAvailable(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) error
    return false;
  }
  return device >= 0 && device < count;
}

absl::StatusOr<BenchmarkResult> RunCudaBenchmark(const BenchmarkRequest& request) {
  std::vector<std::string> offered;
  for (KernelVariant v : cuda::AllVariants()) offered.emplace_back(cuda::VariantName(v));
  std::vector<std::string> requested;  // short names ("v4") spelled out
  for (const std::string& name : request.variants) {
    KernelVariant v;
    requested.push_back(cuda::ParseVariant(name, &v) ? std::string(cuda::VariantName(v)) : name);
  }
  absl::StatusOr<std::vector<std::string>> names = SelectVariants(requested, offered);
  if (!names.ok()) return names.status();
  std::vector<KernelVariant> variants;
  for (const std::string& name : *names) {
    KernelVariant v;
    if (!cuda::ParseVariant(name, &v)) return absl::InternalError("variant name round trip");
    variants.push_back(v);
  }

  absl::StatusOr<SelectedDevice> selected = SelectDevice(request.device);
  if (!selected.ok()) return selected.status();
  const cudaDeviceProp& prop = selected->prop;
  const int l2 = selected->l2_bytes;
  const int64_t rotation_bytes = 4 * static_cast<int64_t>(l2);

  BenchmarkResult result;
  result.backend = "cuda";
  result.device = DeviceDescription(prop, l2);
  absl::Status counters_status = absl::OkStatus();  // the first hardware-counter failure
  Autotuner local_tuner;
  const TuneDevice tune_device{prop.name, prop.major * 10 + prop.minor};
  Autotuner& tuner = request.autotuner != nullptr ? *request.autotuner : local_tuner;

  absl::StatusOr<EventTimer> timing = EventTimer::Create();
  if (!timing.ok()) return timing.status();
  absl::StatusOr<double> peak = MeasurePeakCopy(*timing, request.peak_copy_bytes);
  if (!peak.ok()) return peak.status();
  result.peak_copy_bytes_per_second = *peak;

  std::mt19937_64 rng(request.seed);
  MethodOptions options;
  options.trials = request.trials;
  options.runs = request.runs;
  options.sampled_rows = request.sampled_rows;
  options.cancelled = request.cancelled;
  options.peak_copy_bytes_per_second = *peak;
  for (const BenchmarkShape& s : request.shapes) {
    if (absl::Status c = CheckCancelled(request.cancelled); !c.ok()) return c;
    const QuantShape shape = QuantShapeOf(s);
    // The requested variants this shape's format implements (an AWQ-only v2 is not run on mxfp4).
    const std::vector<KernelVariant> implemented = cuda::VariantsOf(shape.format);
    std::vector<KernelVariant> shape_variants;
    for (KernelVariant v : variants) {
      if (std::find(implemented.begin(), implemented.end(), v) != implemented.end()) {
        shape_variants.push_back(v);
      }
    }
    absl::StatusOr<HostPackedTensor> generated =
        MakeRandomPackedTensor(shape, rng(), request.cancelled);
    if (!generated.ok()) return generated.status();
    const HostPackedTensor& host = *generated;
    for (DType out : request.output_dtypes) {
      if (absl::Status c = CheckCancelled(request.cancelled); !c.ok()) return c;
      const int64_t set_bytes = shape.packed_bytes() + shape.output_bytes(out);
      const int64_t count =
          std::clamp<int64_t>((rotation_bytes + set_bytes - 1) / set_bytes, 2, kMaxBufferSets);
      if (absl::Status m = CheckDeviceMemory(shape, out, count); !m.ok()) return m;
      absl::StatusOr<BufferArena> arena = MakeBufferArena(host, shape.output_bytes(out), count);
      if (!arena.ok()) return arena.status();
      std::vector<BufferSet>& sets = arena->sets;
      absl::StatusOr<OutputChecker> checker =
          OutputChecker::Create(host.view(), out, request.full_check_max_elements);
      if (!checker.ok()) return checker.status();

      std::vector<std::unique_ptr<Runner>> owned;
      std::vector<KernelRunner*> kernels;
      for (KernelVariant v : shape_variants) {
        if (absl::Status c = CheckCancelled(request.cancelled); !c.ok()) return c;
        Autotuner::Result tuned;
        // The configuration a Dequantize call of this layer runs with (the server's objective).
        absl::StatusOr<LaunchConfig> config = cuda::GetOrTuneLaunchConfig(
            tuner, tune_device, v, shape, out, cuda::kDequantizeObjective, &tuned);
        if (!config.ok()) return config.status();
        if (!tuned.save_status.ok()) {
          absl::StrAppend(&result.note, result.note.empty() ? "" : "; ",
                          "tune cache: ", tuned.save_status.message());
        }
        auto kernel = std::make_unique<KernelRunner>(v, *config, out, sets, *timing);
        kernels.push_back(kernel.get());
        owned.push_back(std::move(kernel));
      }
      const size_t first_row = result.rows.size();
      owned.push_back(
          std::make_unique<CopyRunner>(CopyBytesFor(shape.bytes_moved(out)), sets, *timing));
      if (absl::Status s = RunMethodAppend(owned, shape, out, *checker, options, rng, &result.rows);
          !s.ok())
        return s;
      if (absl::Status c = CheckCancelled(request.cancelled); !c.ok()) return c;
      if (request.hardware_counters && counters_status.ok()) {
        counters_status.Update(
            MeasureRowCounters(kernels, timing->stream(), first_row, result.rows));
      }
    }
  }
  if (request.hardware_counters) {
    const std::string counters_note =
        counters_status.ok()
            ? "hardware counters: CUPTI range profiler, one launch per kernel row, L2 flushed "
              "before each replay pass"
            : absl::StrCat("hardware counters unavailable: ", counters_status.message());
    result.note =
        result.note.empty() ? counters_note : absl::StrCat(counters_note, "; ", result.note);
  }
  return result;
}

}  // namespace dequantd::bench
