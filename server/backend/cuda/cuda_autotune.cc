// The autotuner's CUDA side in the server (see cuda_autotune.h).
#include "server/backend/cuda/cuda_autotune.h"

#include <algorithm>
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
    absl::StatusOr<TuneDevice> device = cuda::ReadTuneDevice(d);
    if (!device.ok()) return device.status();
    devices.push_back(*std::move(device));
  }
  return devices;
}

LaunchConfigProvider MakeAutotuneLaunchConfigProvider(Autotuner& tuner,
                                                      std::vector<TuneDevice> devices) {
  return [&tuner, devices = std::move(devices)](
             const LaunchQuery& q) -> absl::StatusOr<cuda::LaunchConfig> {
    if (q.device < 0 || q.device >= static_cast<int>(devices.size())) {
      return absl::InternalError(absl::StrCat("autotune: unknown CUDA device ", q.device));
    }
    return cuda::GetOrTuneLaunchConfig(tuner, devices[q.device], q.variant, q.in.shape, q.out_dtype,
                                       cuda::kDequantizeObjective);
  };
}

TuneKey CudaTuneTarget::Key(const QuantShape& shape, DType out_dtype) const {
  return TuneKey::For(identity_, cuda::VariantName(variant_), shape, out_dtype,
                      cuda::kDequantizeObjective);
}

int CudaTuneTarget::CandidateCount(const QuantShape& shape, DType out_dtype) const {
  if (!cuda::IsTunable(variant_, shape, out_dtype)) return 1;  // DefaultConfig, untimed
  return static_cast<int>(cuda::CandidateConfigs(variant_, shape, out_dtype).size());
}

absl::StatusOr<TuneEntry> CudaTuneTarget::Tune(const QuantShape& shape, DType out_dtype) {
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  return cuda::TuneLaunchConfig(variant_, shape, out_dtype, cuda::kDequantizeObjective);
}

PretuneReport PretuneCuda(Autotuner& tuner, cuda::KernelVariant variant,
                          absl::Span<const TuneDevice> devices, absl::Span<const QuantShape> shapes,
                          absl::Span<const DType> out_dtypes) {
  PretuneReport total;
  std::vector<TuneDevice> done;
  for (int d = 0; d < static_cast<int>(devices.size()); ++d) {
    if (std::find(done.begin(), done.end(), devices[d]) != done.end()) continue;
    done.push_back(devices[d]);
    CudaTuneTarget target(d, devices[d], variant);
    total.Add(Pretune(tuner, target, shapes, out_dtypes));
  }
  return total;
}

}  // namespace dequantd
