#include "kernels/cuda/autotune_cuda.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"

namespace dequantd::cuda {
namespace {

// Owning handles for the CUDA objects of one measurement.
template <typename T, cudaError_t (*Destroy)(T)>
struct Destroyer {
  void operator()(T p) const { (void)Destroy(p); }
};
using Event =
    std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, Destroyer<cudaEvent_t, cudaEventDestroy>>;
using Stream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>,
                               Destroyer<cudaStream_t, cudaStreamDestroy>>;
using Graph = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>,
                              Destroyer<cudaGraphExec_t, cudaGraphExecDestroy>>;
using Memory = std::unique_ptr<void, Destroyer<void*, cudaFree>>;

// One measurement at a time in this process: tunings of different keys do not share the GPU.
std::mutex& MeasureMutex() {
  static std::mutex mu;
  return mu;
}

constexpr int64_t Align(int64_t n) { return (n + 255) / 256 * 256; }

// Buffer sets for (shape, out_dtype) carved out of one allocation, each a full input + output.
struct ScratchSets {
  Memory memory;
  std::vector<QuantView> in;
  std::vector<void*> out;
};

// An empty kernel launched between two timed launches for TuneObjective::kLatency: launched
// without programmatic dependent launch, it starts only once the previous launch has completely
// finished, and the next launch waits for it (griddepcontrol.wait), so no two timed launches
// overlap. Costs the same few microseconds for every candidate.
__global__ void SerializeKernel() {}

absl::StatusOr<ScratchSets> MakeScratch(const QuantShape& shape, DType out_dtype,
                                        const TuneOptions& options, cudaStream_t stream) {
  // One set: the format's stored tensors in role order, then the output, each 256-byte aligned.
  const int roles = TensorRoleCount(shape.format);
  std::array<int64_t, kMaxTensorRoles> tensor_at{};
  int64_t out_at = 0;
  for (int r = 0; r < roles; ++r) {
    tensor_at[static_cast<size_t>(r)] = out_at;
    out_at += Align(TensorSpecOf(shape, r).bytes());
  }
  const int64_t stride = out_at + Align(shape.output_bytes(out_dtype));
  int device = 0;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  int64_t rotation = options.rotation_bytes;
  if (rotation <= 0) {
    int l2 = 0;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    rotation = 4 * static_cast<int64_t>(l2);
  }
  size_t free_bytes = 0, total_bytes = 0;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int64_t allowed =
      static_cast<int64_t>(static_cast<double>(free_bytes) * options.max_free_memory_fraction);
  const int64_t wanted = std::clamp<int64_t>((rotation + stride - 1) / stride, 2, 1024);
  const int64_t count = std::min<int64_t>(wanted, allowed / stride);
  if (count < 1) {
    return absl::ResourceExhaustedError(
        absl::StrCat("autotune: one scratch buffer set of ", stride, " bytes for K=", shape.K,
                     " N=", shape.N, " does not fit in ", allowed, " bytes (",
                     options.max_free_memory_fraction, " of the free device memory)"));
  }
  void* raw = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMalloc(&raw, static_cast<size_t>(stride * count)));
  ScratchSets sets;
  sets.memory.reset(raw);
  auto* base = static_cast<uint8_t*>(raw);
  // 0x3C bytes: AWQ scale 0x3C3C = 1.0586 (fp16) / 0.0115 (bf16), nibbles 12 and 3: finite
  // outputs (a format whose 0x3C bytes decode to non-finite values times the same work).
  DEQUANTD_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(base, 0x3C, static_cast<size_t>(stride * count), stream));
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* set = base + i * stride;
    QuantView view;
    view.shape = shape;
    for (int r = 0; r < roles; ++r)
      view.tensors[static_cast<size_t>(r)] = set + tensor_at[static_cast<size_t>(r)];
    sets.in.push_back(view);
    sets.out.push_back(set + out_at);
  }
  return sets;
}

// A graph of `launches` launches of (v, config), launch i on set i % sets; for kLatency each
// launch is preceded by SerializeKernel (a Dequantize call's launch follows copies, not a kernel
// it could overlap).
absl::StatusOr<Graph> CaptureLaunches(KernelVariant v, const LaunchConfig& config, DType out_dtype,
                                      TuneObjective objective, const ScratchSets& sets,
                                      int launches, cudaStream_t stream) {
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  absl::Status enqueued;
  for (int i = 0; i < launches && enqueued.ok(); ++i) {
    const size_t s = static_cast<size_t>(i) % sets.in.size();
    if (objective == TuneObjective::kLatency) {
      SerializeKernel<<<1, 32, 0, stream>>>();
      enqueued.Update(CudaStatus(cudaGetLastError(), "SerializeKernel", __FILE__, __LINE__));
    }
    if (enqueued.ok()) {
      enqueued.Update(LaunchDequantize(v, config, sets.in[s], out_dtype, sets.out[s], stream));
    }
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!enqueued.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return enqueued;
  }
  DEQUANTD_CUDA_RETURN_IF_ERROR(ended);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  DEQUANTD_CUDA_RETURN_IF_ERROR(instantiated);
  return Graph(exec);
}

// Seconds of one replay of `graph` on `stream`.
absl::StatusOr<double> TimeReplay(cudaGraphExec_t graph, cudaStream_t stream, cudaEvent_t start,
                                  cudaEvent_t stop) {
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph, stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
  float ms = 0;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
  return ms * 1e-3;
}

absl::StatusOr<Event> MakeEvent() {
  cudaEvent_t e = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  return Event(e);
}

// The measurement proper, on `stream` (the caller synchronizes and frees).
absl::StatusOr<std::vector<CandidateSamples>> Measure(KernelVariant v, DType out_dtype,
                                                      TuneObjective objective,
                                                      absl::Span<const LaunchConfig> candidates,
                                                      const ScratchSets& sets,
                                                      const TuneOptions& options,
                                                      cudaStream_t stream) {
  absl::StatusOr<Event> start = MakeEvent();
  if (!start.ok()) return start.status();
  absl::StatusOr<Event> stop = MakeEvent();
  if (!stop.ok()) return stop.status();

  // Launches per sample, from a short graph of the first candidate, replayed first for at least
  // kWarmUpSeconds of GPU time: an idle GPU runs at a low clock and ramps up within milliseconds,
  // which would otherwise favour whichever candidates are timed last.
  constexpr int kProbeLaunches = 8;
  constexpr double kWarmUpSeconds = 0.025;
  constexpr int kMaxWarmUpReplays = 400;
  absl::StatusOr<Graph> probe =
      CaptureLaunches(v, candidates[0], out_dtype, objective, sets, kProbeLaunches, stream);
  if (!probe.ok()) return probe.status();
  double per_launch = 0;
  double warmed = 0;
  for (int i = 0; i < kMaxWarmUpReplays && (i < 2 || warmed < kWarmUpSeconds); ++i) {
    absl::StatusOr<double> t = TimeReplay(probe->get(), stream, start->get(), stop->get());
    if (!t.ok()) return t.status();
    per_launch = *t / kProbeLaunches;  // the last replay's: at the warmed-up clock
    warmed += *t;
  }
  const int launches = static_cast<int>(
      std::clamp(std::ceil(options.sample_seconds / std::max(per_launch, 1e-7)), 1.0,
                 static_cast<double>(std::max(1, options.max_launches_per_sample))));

  std::vector<Graph> graphs;
  for (const LaunchConfig& c : candidates) {
    absl::StatusOr<Graph> g = CaptureLaunches(v, c, out_dtype, objective, sets, launches, stream);
    if (!g.ok()) return g.status();
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(g->get(), stream));  // upload + warm-up
    graphs.push_back(*std::move(g));
  }
  std::vector<CandidateSamples> samples;
  for (const LaunchConfig& c : candidates) samples.push_back(CandidateSamples{c, {}});
  const size_t n = candidates.size();
  const int rounds = std::max(1, options.rounds);
  for (int r = 0; r < rounds; ++r) {
    for (size_t j = 0; j < n; ++j) {
      const size_t i = (j + static_cast<size_t>(r)) % n;  // round r starts at candidate r
      absl::StatusOr<double> t = TimeReplay(graphs[i].get(), stream, start->get(), stop->get());
      if (!t.ok()) return t.status();
      samples[i].seconds.push_back(*t / launches);
    }
  }
  return samples;
}

}  // namespace

absl::StatusOr<TuneDevice> ReadTuneDevice(int device) {
  cudaDeviceProp prop;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  return TuneDevice{prop.name, prop.major * 10 + prop.minor};
}

absl::StatusOr<std::vector<CandidateSamples>> MeasureCandidates(
    KernelVariant v, const QuantShape& shape, DType out_dtype, TuneObjective objective,
    absl::Span<const LaunchConfig> candidates, const TuneOptions& options) {
  if (absl::Status s = ValidateShape(shape, out_dtype); !s.ok()) return s;
  if (candidates.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no launch configuration of ", std::string(VariantName(v)), " to measure for K=", shape.K,
        " N=", shape.N, " group_size=", shape.group_size));
  }
  for (const LaunchConfig& c : candidates) {
    if (absl::Status s = CanImplement(v, c, shape, out_dtype); !s.ok()) return s;
  }
  std::lock_guard lock(MeasureMutex());
  cudaStream_t raw_stream = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking));
  Stream stream(raw_stream);
  absl::StatusOr<ScratchSets> sets = MakeScratch(shape, out_dtype, options, raw_stream);
  if (!sets.ok()) return sets.status();
  absl::StatusOr<std::vector<CandidateSamples>> samples =
      Measure(v, out_dtype, objective, candidates, *sets, options, raw_stream);
  // The scratch is freed on return: no launch may still use it.
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(raw_stream));
  return samples;
}

absl::StatusOr<TuneEntry> TuneLaunchConfig(KernelVariant v, const QuantShape& shape,
                                           DType out_dtype, TuneObjective objective,
                                           const TuneOptions& options) {
  if (absl::Status s = ValidateShape(shape, out_dtype); !s.ok()) return s;
  const std::vector<LaunchConfig> candidates = CandidateConfigs(v, shape, out_dtype);
  absl::StatusOr<std::vector<CandidateSamples>> samples =
      MeasureCandidates(v, shape, out_dtype, objective, candidates, options);
  if (!samples.ok()) return samples.status();
  absl::StatusOr<CandidateChoice> choice = ChooseCandidate(*samples);
  if (!choice.ok()) return choice.status();
  return TuneEntry{candidates[choice->index], choice->seconds};
}

absl::StatusOr<LaunchConfig> GetOrTuneLaunchConfig(Autotuner& tuner, const TuneDevice& device,
                                                   KernelVariant v, const QuantShape& shape,
                                                   DType out_dtype, TuneObjective objective,
                                                   Autotuner::Result* result,
                                                   const TuneOptions& options) {
  if (absl::Status s = ValidateShape(shape, out_dtype); !s.ok()) return s;
  if (!IsTunable(v, shape, out_dtype)) return DefaultConfig(v, shape, out_dtype);
  const size_t candidates = CandidateConfigs(v, shape, out_dtype).size();
  const TuneKey key = TuneKey::For(device, VariantName(v), shape, out_dtype, objective);
  absl::StatusOr<Autotuner::Result> r = tuner.GetOrTune(key, static_cast<int>(candidates), [&] {
    return TuneLaunchConfig(v, shape, out_dtype, objective, options);
  });
  if (!r.ok()) return r.status();
  if (result != nullptr) *result = *r;
  return r->entry.config;
}

}  // namespace dequantd::cuda
