// The autotuner's CUDA side: measures a kernel variant's candidate launch configurations for one
// shape and returns the fastest, as a tune_fn for Autotuner::GetOrTune (kernels/autotune.h).
// Host API; compiled only when DEQUANTD_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/statusor.h"
#include "kernels/autotune.h"
#include "kernels/cuda/dequant_cuda.h"

namespace dequantd::cuda {

// Tuning effort for one shape.
struct TuneOptions {
  int launches_per_config = 4;   // back-to-back launches timed together per candidate
  double max_gpu_seconds = 0.1;  // stop sweeping once this much GPU time is spent (issue 3)
};

TunedConfig ToTunedConfig(const LaunchConfig& c);
LaunchConfig ToLaunchConfig(const TunedConfig& c);

// The cache key for (v, shape, out_dtype) on CUDA device `device` (name and compute capability
// from cudaGetDeviceProperties). INTERNAL on a CUDA error.
absl::StatusOr<TuneKey> MakeTuneKey(int device, KernelVariant v, const AwqShape& shape,
                                    DType out_dtype);

// Times every CandidateConfigs(v, shape, out_dtype) entry that CanImplement accepts on `stream`
// with CUDA events (one warm-up launch, then launches_per_config back-to-back launches per
// candidate, time per launch), within max_gpu_seconds in total, and returns the fastest.
// `in` (device pointers) and `out` (device, K * N elements of out_dtype) are the buffers launched
// on; their contents are overwritten (`out`) or only read (`in`). Synchronizes `stream`.
// Errors: INVALID_ARGUMENT when no candidate can be implemented; INTERNAL on a CUDA error.
absl::StatusOr<TuneEntry> TuneLaunchConfig(KernelVariant v, const PackedTensorView& in,
                                           DType out_dtype, void* out, cudaStream_t stream,
                                           const TuneOptions& options = {});

// As above on freshly allocated scratch buffers for `shape` (inputs filled with a non-zero byte
// pattern, freed before returning). RESOURCE_EXHAUSTED when they do not fit.
absl::StatusOr<TuneEntry> TuneLaunchConfigScratch(KernelVariant v, const AwqShape& shape,
                                                  DType out_dtype, cudaStream_t stream,
                                                  const TuneOptions& options = {});

// The configuration to launch (v, in, out_dtype) with on the current device: from `tuner`
// (tuning on `in`/`out` on a miss, see Autotuner::GetOrTune). Variants with a single candidate
// are not tuned: DefaultConfig is returned. `result` (optional) receives GetOrTune's result for
// logging (tuned, save_status).
absl::StatusOr<LaunchConfig> GetOrTuneLaunchConfig(Autotuner& tuner, KernelVariant v,
                                                   const PackedTensorView& in, DType out_dtype,
                                                   void* out, cudaStream_t stream,
                                                   Autotuner::Result* result = nullptr,
                                                   const TuneOptions& options = {});

}  // namespace dequantd::cuda
