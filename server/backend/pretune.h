// Start-up tuning (dequantd --pretune): every distinct layer shape of the model is tuned through
// the autotuner (kernels/autotune.h) before serving, so no request pays a tuning. CPU-only: the
// CUDA target is server/backend/cuda/cuda_autotune.h, and tests drive this file with a fake
// TuneTarget.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/autotune.h"
#include "kernels/awq_format.h"
#include "server/model/checkpoint.h"

namespace dequantd {

// The distinct (K, N, group_size, scale_dtype) of `layers`, in order of first appearance: what
// --pretune tunes.
std::vector<QuantShape> DistinctLayerShapes(absl::Span<const QuantizedLayer> layers);

// One device and kernel variant to tune for, as Pretune sees it. The CUDA implementation is in
// server/backend/cuda/cuda_autotune.h; tests use a fake.
class TuneTarget {
 public:
  virtual ~TuneTarget() = default;
  // The key of (shape, out_dtype) on this target (TuneKey::For).
  virtual TuneKey Key(const QuantShape& shape, DType out_dtype) const = 0;
  // Number of candidate launch configurations a tuning chooses among; at most 1 means there is
  // nothing to tune (e.g. cuda::IsTunable is false: DefaultConfig is launched untimed).
  virtual int CandidateCount(const QuantShape& shape, DType out_dtype) const = 0;
  // Measures the candidates and returns the winner.
  virtual absl::StatusOr<TuneEntry> Tune(const QuantShape& shape, DType out_dtype) = 0;
};

// What Pretune did.
struct PretuneReport {
  int keys = 0;              // (shape, out dtype) pairs considered
  int tuned = 0;             // tuned now
  int cached = 0;            // already held (e.g. loaded from the cache file)
  int untunable = 0;         // nothing to tune (one candidate, or a rule-based default)
  int failed = 0;            // tunings that returned an error (the server still starts)
  absl::Status first_error;  // the first failure, naming its key; OK if none
  double wall_seconds = 0;   // total host wall time, seconds

  // Adds `other`'s counts and time; keeps the first error.
  void Add(const PretuneReport& other);
};

// Gets every tunable (shape, out_dtype) of `shapes` x `out_dtypes` on `target` through
// tuner.GetOrTune, one after another (so hits, misses and tunings are counted and observed as for
// requests). Failures are counted, not fatal.
PretuneReport Pretune(Autotuner& tuner, TuneTarget& target, absl::Span<const QuantShape> shapes,
                      absl::Span<const DType> out_dtypes);

}  // namespace dequantd
