// The autotuner's CUDA side in the server (see cuda_autotune.h).
#include "server/cuda_autotune.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/autotune_cuda.h"
#include "kernels/cuda/cuda_status.h"

namespace dequantd {

absl::StatusOr<std::vector<TuneDevice>> ReadTuneDevices() {
  int count = 0;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  std::vector<TuneDevice> devices;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, d));
    devices.push_back(TuneDevice{prop.name, prop.major * 10 + prop.minor});
  }
  return devices;
}

LaunchConfigProvider MakeAutotuneLaunchConfigProvider(ServerAutotuner& tuner,
                                                      std::vector<TuneDevice> devices) {
  return [&tuner, devices = std::move(devices)](
             const LaunchQuery& q) -> absl::StatusOr<cuda::LaunchConfig> {
    if (q.device < 0 || q.device >= static_cast<int>(devices.size())) {
      return absl::InternalError(absl::StrCat("autotune: unknown CUDA device ", q.device));
    }
    const TuneKey key =
        MakeServerTuneKey(devices[q.device], cuda::VariantName(q.variant), q.in.shape, q.out_dtype);
    if (std::optional<TunedConfig> hit = tuner.Lookup(key)) return cuda::ToLaunchConfig(*hit);
    const size_t candidates = cuda::CandidateConfigs(q.variant, q.in.shape, q.out_dtype).size();
    if (candidates <= 1) return cuda::DefaultConfig(q.variant, q.in.shape, q.out_dtype);
    absl::StatusOr<TunedConfig> tuned = tuner.Tune(key, static_cast<int>(candidates), [&] {
      return cuda::TuneLaunchConfig(q.variant, q.in, q.out_dtype, q.out, q.stream);
    });
    if (!tuned.ok()) return tuned.status();
    return cuda::ToLaunchConfig(*tuned);
  };
}

absl::StatusOr<std::unique_ptr<CudaTuneTarget>> CudaTuneTarget::Create(
    int device, TuneDevice identity, cuda::KernelVariant variant) {
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::unique_ptr<CudaTuneTarget>(
      new CudaTuneTarget(device, std::move(identity), variant, stream));
}

CudaTuneTarget::~CudaTuneTarget() {
  if (stream_ != nullptr) {
    cudaSetDevice(device_);
    cudaStreamDestroy(stream_);
  }
}

TuneKey CudaTuneTarget::Key(const AwqShape& shape, DType out_dtype) const {
  return MakeServerTuneKey(identity_, cuda::VariantName(variant_), shape, out_dtype);
}

int CudaTuneTarget::CandidateCount(const AwqShape& shape, DType out_dtype) const {
  return static_cast<int>(cuda::CandidateConfigs(variant_, shape, out_dtype).size());
}

absl::StatusOr<TuneEntry> CudaTuneTarget::TuneScratch(const AwqShape& shape, DType out_dtype) {
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  return cuda::TuneLaunchConfigScratch(variant_, shape, out_dtype, stream_);
}

absl::StatusOr<PretuneReport> PretuneCuda(ServerAutotuner& tuner, cuda::KernelVariant variant,
                                          absl::Span<const TuneDevice> devices,
                                          absl::Span<const AwqShape> shapes,
                                          absl::Span<const DType> out_dtypes) {
  PretuneReport total;
  std::vector<TuneDevice> done;
  for (int d = 0; d < static_cast<int>(devices.size()); ++d) {
    if (std::find(done.begin(), done.end(), devices[d]) != done.end()) continue;
    done.push_back(devices[d]);
    absl::StatusOr<std::unique_ptr<CudaTuneTarget>> target =
        CudaTuneTarget::Create(d, devices[d], variant);
    if (!target.ok()) return target.status();
    const PretuneReport r = Pretune(tuner, **target, shapes, out_dtypes);
    total.keys += r.keys;
    total.tuned += r.tuned;
    total.cached += r.cached;
    total.untunable += r.untunable;
    total.failed += r.failed;
    if (total.first_error.ok()) total.first_error = r.first_error;
    total.wall_seconds += r.wall_seconds;
  }
  return total;
}

}  // namespace dequantd
