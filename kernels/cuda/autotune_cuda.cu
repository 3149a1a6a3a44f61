#include "kernels/cuda/autotune_cuda.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"

namespace dequantd::cuda {
namespace {

struct EventDeleter {
  void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
};
using Event = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter>;

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;

absl::StatusOr<Event> MakeEvent() {
  cudaEvent_t e = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  return Event(e);
}

absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes) {
  void* p = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
  return DeviceBuffer(p);
}

// Seconds per launch of `count` back-to-back launches of (v, config), timed with events.
absl::StatusOr<double> TimeLaunches(KernelVariant v, const LaunchConfig& config,
                                    const PackedTensorView& in, DType out_dtype, void* out,
                                    cudaStream_t stream, int count, cudaEvent_t start,
                                    cudaEvent_t stop) {
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
  for (int i = 0; i < count; ++i) {
    if (absl::Status s = LaunchDequantize(v, config, in, out_dtype, out, stream); !s.ok()) return s;
  }
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
  float ms = 0;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
  return ms * 1e-3 / count;
}

}  // namespace

TunedConfig ToTunedConfig(const LaunchConfig& c) {
  return TunedConfig{c.block_size, c.words_per_thread, c.rows_per_thread};
}

LaunchConfig ToLaunchConfig(const TunedConfig& c) {
  LaunchConfig l;
  l.block_size = c.block_size;
  l.words_per_thread = c.words_per_thread;
  l.rows_per_thread = c.rows_per_thread;
  return l;
}

absl::StatusOr<TuneKey> MakeTuneKey(int device, KernelVariant v, const AwqShape& shape,
                                    DType out_dtype) {
  cudaDeviceProp prop;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  return TuneKey::For(prop.name, prop.major * 10 + prop.minor, VariantName(v), shape, out_dtype);
}

absl::StatusOr<TuneEntry> TuneLaunchConfig(KernelVariant v, const PackedTensorView& in,
                                           DType out_dtype, void* out, cudaStream_t stream,
                                           const TuneOptions& options) {
  std::vector<LaunchConfig> candidates;
  for (const LaunchConfig& c : CandidateConfigs(v, in.shape, out_dtype)) {
    if (CanImplement(v, c, in.shape, out_dtype).ok()) candidates.push_back(c);
  }
  if (candidates.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no launch configuration of ", std::string(VariantName(v)), " can implement K=", in.shape.K,
        " N=", in.shape.N, " group_size=", in.shape.group_size));
  }
  absl::StatusOr<Event> start = MakeEvent();
  if (!start.ok()) return start.status();
  absl::StatusOr<Event> stop = MakeEvent();
  if (!stop.ok()) return stop.status();

  const int launches = std::max(1, options.launches_per_config);
  double spent = 0;  // GPU seconds, counting warm-ups
  TuneEntry best;
  best.seconds = std::numeric_limits<double>::infinity();
  for (const LaunchConfig& c : candidates) {
    // Warm-up (also the estimate of what the timed launches will cost).
    absl::StatusOr<double> warm =
        TimeLaunches(v, c, in, out_dtype, out, stream, 1, start->get(), stop->get());
    if (!warm.ok()) return warm.status();
    spent += *warm;
    if (spent + *warm * launches > options.max_gpu_seconds && best.seconds < *warm) {
      break;  // timing it would exceed the budget, and it is already slower than the best
    }
    absl::StatusOr<double> t =
        TimeLaunches(v, c, in, out_dtype, out, stream, launches, start->get(), stop->get());
    if (!t.ok()) return t.status();
    spent += *t * launches;
    if (*t < best.seconds) best = TuneEntry{ToTunedConfig(c), *t};
    if (spent > options.max_gpu_seconds) break;
  }
  return best;
}

absl::StatusOr<TuneEntry> TuneLaunchConfigScratch(KernelVariant v, const AwqShape& shape,
                                                  DType out_dtype, cudaStream_t stream,
                                                  const TuneOptions& options) {
  if (absl::Status s = ValidateShape(shape, out_dtype); !s.ok()) return s;
  absl::StatusOr<DeviceBuffer> qweight = Allocate(shape.qweight_bytes());
  if (!qweight.ok()) return qweight.status();
  absl::StatusOr<DeviceBuffer> qzeros = Allocate(shape.qzeros_bytes());
  if (!qzeros.ok()) return qzeros.status();
  absl::StatusOr<DeviceBuffer> scales = Allocate(shape.scales_bytes());
  if (!scales.ok()) return scales.status();
  absl::StatusOr<DeviceBuffer> out = Allocate(shape.output_bytes(out_dtype));
  if (!out.ok()) return out.status();
  // 0x3C bytes: scale 0x3C3C = 1.05859375 (fp16) / 0.0114746 (bf16), nibbles 12 and 3.
  DEQUANTD_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(qweight->get(), 0x3C, shape.qweight_bytes(), stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(qzeros->get(), 0x3C, shape.qzeros_bytes(), stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scales->get(), 0x3C, shape.scales_bytes(), stream));
  PackedTensorView in;
  in.shape = shape;
  in.qweight = static_cast<const int32_t*>(qweight->get());
  in.qzeros = static_cast<const int32_t*>(qzeros->get());
  in.scales = scales->get();
  absl::StatusOr<TuneEntry> entry = TuneLaunchConfig(v, in, out_dtype, out->get(), stream, options);
  // The buffers are freed on return; make sure no launch still uses them.
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return entry;
}

absl::StatusOr<LaunchConfig> GetOrTuneLaunchConfig(Autotuner& tuner, KernelVariant v,
                                                   const PackedTensorView& in, DType out_dtype,
                                                   void* out, cudaStream_t stream,
                                                   Autotuner::Result* result,
                                                   const TuneOptions& options) {
  if (CandidateConfigs(v, in.shape, out_dtype).size() <= 1) {
    if (absl::Status s = ValidateShape(in.shape, out_dtype); !s.ok()) return s;
    return DefaultConfig(v, in.shape, out_dtype);
  }
  int device = 0;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  absl::StatusOr<TuneKey> key = MakeTuneKey(device, v, in.shape, out_dtype);
  if (!key.ok()) return key.status();
  absl::StatusOr<Autotuner::Result> r = tuner.GetOrTune(
      *key, [&] { return TuneLaunchConfig(v, in, out_dtype, out, stream, options); });
  if (!r.ok()) return r.status();
  if (result != nullptr) *result = *r;
  return ToLaunchConfig(r->entry.config);
}

}  // namespace dequantd::cuda
