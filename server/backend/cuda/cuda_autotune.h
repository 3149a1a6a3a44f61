// The autotuner's CUDA side in the server: the LaunchConfigProvider the CUDA backend calls for
// every launch, and the TuneTarget of --pretune. Compiled only when DEQUANTD_HAVE_CUDA.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/autotune.h"
#include "kernels/cuda/dequant_cuda.h"
#include "server/backend/cuda/cuda_backend.h"
#include "server/backend/pretune.h"

namespace dequantd {

// The TuneKey identity of every visible GPU, indexed by ordinal (read once at start, so no
// launch queries device properties). INTERNAL on a CUDA error.
absl::StatusOr<std::vector<TuneDevice>> ReadTuneDevices();

// A provider for CudaBackendOptions::launch_config: cuda::GetOrTuneLaunchConfig on `tuner` with
// `devices[q.device]`, q.variant, q.in.shape, q.out_dtype and cuda::kDequantizeObjective (a miss
// tunes on scratch buffers of the current device; single flight per key). `tuner` must outlive the
// provider. Thread-safe. Errors: INTERNAL for an unknown device ordinal; the tuning's.
LaunchConfigProvider MakeAutotuneLaunchConfigProvider(Autotuner& tuner,
                                                      std::vector<TuneDevice> devices);

// A TuneTarget for `variant` on CUDA device `device` (cuda::kDequantizeObjective keys): tunes with
// cuda::TuneLaunchConfig after cudaSetDevice(device).
class CudaTuneTarget final : public TuneTarget {
 public:
  CudaTuneTarget(int device, TuneDevice identity, cuda::KernelVariant variant)
      : device_(device), identity_(std::move(identity)), variant_(variant) {}

  TuneKey Key(const QuantShape& shape, DType out_dtype) const override;
  int CandidateCount(const QuantShape& shape, DType out_dtype) const override;
  absl::StatusOr<TuneEntry> Tune(const QuantShape& shape, DType out_dtype) override;

 private:
  const int device_;
  const TuneDevice identity_;
  const cuda::KernelVariant variant_;
};

// Pretune (pretune.h) of `shapes` x `out_dtypes` for `variant` once per distinct GPU identity in
// `devices` (identical GPUs share their entries). The reports are summed.
PretuneReport PretuneCuda(Autotuner& tuner, cuda::KernelVariant variant,
                          absl::Span<const TuneDevice> devices, absl::Span<const QuantShape> shapes,
                          absl::Span<const DType> out_dtypes);

}  // namespace dequantd
