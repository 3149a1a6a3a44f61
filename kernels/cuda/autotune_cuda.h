// The autotuner's CUDA side: measures a kernel variant's candidate launch configurations the way
// they will run and picks one with ChooseCandidate (kernels/autotune.h), as the tune function of
// Autotuner::GetOrTune. Host API; compiled only when DEQUANTD_HAVE_CUDA.
//
// Method (docs/architecture.md "Autotuner"): scratch buffer sets (inputs + output) covering at
// least 4 x L2, rotated launch after launch so the L2 never serves the inputs; one sample = one
// CUDA graph of L launches (L such that a sample is about 1 ms of GPU time, past launch noise),
// timed with events; R interleaved rounds (round r starts at candidate r, so drift hits all
// alike); the rule of ChooseCandidate on the rounds.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/autotune.h"
#include "kernels/cuda/dequant_cuda.h"

namespace dequantd::cuda {

// What a Dequantize call's launch is tuned for (the server's provider, --pretune, dequantd_bench):
// the latency of one launch, since a single-layer call launches once after copies and has no
// kernel to overlap with. docs/architecture.md "Autotuner" says why.
inline constexpr TuneObjective kDequantizeObjective = TuneObjective::kLatency;

// Tuning effort for one key. Defaults: <= 16 candidates x (5 rounds + 1 warm-up) x ~1 ms, about
// 0.1 s of GPU time per key (measured per shape in docs/performance.md).
struct TuneOptions {
  int rounds = 5;                          // interleaved rounds, one sample per candidate each
  double sample_seconds = 1e-3;            // GPU time one sample aims at
  int max_launches_per_sample = 512;       // bound on L (tiny layers)
  int64_t rotation_bytes = 0;              // buffer sets cover at least this; 0 = 4 x the L2 size
  double max_free_memory_fraction = 0.25;  // scratch may take at most this of free memory
};

// The TuneKey identity of CUDA device `device` (name, compute capability). INTERNAL on a CUDA
// error.
absl::StatusOr<TuneDevice> ReadTuneDevice(int device);

// Times `candidates` (each CanImplement-able) for (v, shape, out_dtype) by the method above on
// the current device, on scratch buffers (inputs filled with a fixed byte pattern) and a stream
// of its own; returns their rounds in the given order. One measurement per process at a time
// (a mutex), so concurrent tunings do not disturb each other's timings. Synchronizes the device
// work it enqueued and frees the scratch before returning.
// Errors: INVALID_ARGUMENT (ValidateShape, no candidates, a candidate CanImplement refuses);
// RESOURCE_EXHAUSTED when not even one buffer set fits in the allowed free memory; INTERNAL on a
// CUDA error.
absl::StatusOr<std::vector<CandidateSamples>> MeasureCandidates(
    KernelVariant v, const QuantShape& shape, DType out_dtype, TuneObjective objective,
    absl::Span<const LaunchConfig> candidates, const TuneOptions& options = {});

// MeasureCandidates over CandidateConfigs(v, shape, out_dtype), then ChooseCandidate: the entry
// holds the choice and its median seconds per launch. Errors: as MeasureCandidates.
absl::StatusOr<TuneEntry> TuneLaunchConfig(KernelVariant v, const QuantShape& shape,
                                           DType out_dtype, TuneObjective objective,
                                           const TuneOptions& options = {});

// The configuration to launch (v, shape, out_dtype) with on `device` for `objective`: through
// tuner.GetOrTune with TuneKey::For(device, VariantName(v), shape, out_dtype, objective) and
// TuneLaunchConfig on the current device on a miss. Where IsTunable is false (a variant with a
// single candidate, v4 on a small layer) nothing is tuned nor counted: DefaultConfig. `result`
// (optional) receives GetOrTune's result. Errors: ValidateShape's; TuneLaunchConfig's.
absl::StatusOr<LaunchConfig> GetOrTuneLaunchConfig(Autotuner& tuner, const TuneDevice& device,
                                                   KernelVariant v, const QuantShape& shape,
                                                   DType out_dtype, TuneObjective objective,
                                                   Autotuner::Result* result = nullptr,
                                                   const TuneOptions& options = {});

}  // namespace dequantd::cuda
