// The autotuner's CUDA side in the server: the LaunchConfigProvider the CUDA backend calls for
// every launch (cache hit, or tuning on the request's own buffers on a miss), and the scratch
// tuning of --pretune. Compiled only when DEQUANTD_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cuda/dequant_cuda.h"
#include "server/cuda_backend.h"
#include "server/server_autotuner.h"

namespace dequantd {

// The TuneKey identity (name, compute capability) of every visible GPU, indexed by ordinal.
// INTERNAL on a CUDA error.
absl::StatusOr<std::vector<TuneDevice>> ReadTuneDevices();

// A provider for CudaBackendOptions::launch_config: the key is built from `devices[q.device]`,
// q.variant, q.in.shape and q.out_dtype; a cached entry is returned (a hit); otherwise a variant
// with several candidate configurations is tuned on q.in / q.out / q.stream (a miss, single
// flight per key), and a variant with one candidate gets cuda::DefaultConfig without counting.
// `tuner` must outlive the provider. Thread-safe. Errors: INTERNAL for an unknown device
// ordinal, the tuning's (INVALID_ARGUMENT, INTERNAL).
LaunchConfigProvider MakeAutotuneLaunchConfigProvider(ServerAutotuner& tuner,
                                                      std::vector<TuneDevice> devices);

// A TuneTarget for `variant` on CUDA device `device`: tunes on scratch buffers
// (cuda::TuneLaunchConfigScratch) on a stream of its own. Not thread-safe; one at a time.
class CudaTuneTarget final : public TuneTarget {
 public:
  // Creates the stream on `device`. INTERNAL on a CUDA error.
  static absl::StatusOr<std::unique_ptr<CudaTuneTarget>> Create(int device, TuneDevice identity,
                                                                cuda::KernelVariant variant);
  ~CudaTuneTarget() override;

  TuneKey Key(const AwqShape& shape, DType out_dtype) const override;
  int CandidateCount(const AwqShape& shape, DType out_dtype) const override;
  absl::StatusOr<TuneEntry> TuneScratch(const AwqShape& shape, DType out_dtype) override;

 private:
  CudaTuneTarget(int device, TuneDevice identity, cuda::KernelVariant variant, cudaStream_t stream)
      : device_(device), identity_(std::move(identity)), variant_(variant), stream_(stream) {}

  const int device_;
  const TuneDevice identity_;
  const cuda::KernelVariant variant_;
  cudaStream_t stream_;
};

// Pretune (server_autotuner.h) of `shapes` x `out_dtypes` for `variant` once per distinct GPU
// identity in `devices` (identical GPUs share their cache entries). The reports are summed.
// Errors: INTERNAL when a device's stream cannot be created.
absl::StatusOr<PretuneReport> PretuneCuda(ServerAutotuner& tuner, cuda::KernelVariant variant,
                                          absl::Span<const TuneDevice> devices,
                                          absl::Span<const AwqShape> shapes,
                                          absl::Span<const DType> out_dtypes);

}  // namespace dequantd
