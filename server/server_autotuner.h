// The server's autotuner: one Autotuner (kernels/autotune.h) with its cache file, the hit/miss
// accounting of the serving path, events for logs and metrics, and start-up tuning (--pretune).
// CPU-only: the CUDA side (the launch-config provider and the scratch tuning) is
// server/cuda_autotune.h, and tests drive this file with a fake TuneTarget.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/autotune.h"
#include "kernels/awq_format.h"
#include "server/checkpoint.h"

namespace dequantd {

// What identifies a GPU in a TuneKey (cudaDeviceProp::name and major * 10 + minor).
struct TuneDevice {
  std::string name;            // e.g. "NVIDIA H200"
  int compute_capability = 0;  // e.g. 90
  bool operator==(const TuneDevice&) const = default;
};

// The cache key of one launch: `variant` (cuda::VariantName) of `shape` into `out_dtype` on
// `device`.
TuneKey MakeServerTuneKey(const TuneDevice& device, std::string_view variant, const AwqShape& shape,
                          DType out_dtype);

// "block=256,words=4,rows=2" (the format of cuda::LaunchConfig::ToString), for logs.
std::string TunedConfigToString(const TunedConfig& config);

// The tune cache file the server uses: `flag` (--tune-cache) when set, else DefaultTuneCachePath()
// ($XDG_CACHE_HOME/dequantd/tune_cache.json, else $HOME/.cache/dequantd/tune_cache.json, else ""
// meaning memory only).
std::string ResolveTuneCachePath(const std::string& flag);

// Creates the parent directory of `path` (and its parents). OK for "" and for an existing
// directory; INTERNAL naming the directory and the error otherwise.
absl::Status CreateTuneCacheDirectory(const std::string& path);

// The distinct (K, N, group_size, scale_dtype) of `layers`, in order of first appearance: what
// --pretune tunes.
std::vector<AwqShape> DistinctLayerShapes(absl::Span<const QuantizedLayer> layers);

// One tuning that finished (successfully or not), for the log line
// "autotune: tuned <key> -> <config> in X ms (N candidates)" and the tuning-time metric.
struct AutotuneTuning {
  TuneKey key;
  absl::StatusOr<TuneEntry> result = absl::UnknownError("not tuned");  // the winner, or why not
  double wall_seconds = 0;   // host wall time of the whole tuning, seconds
  int candidates = 0;        // candidate launch configurations of the variant for this shape
  absl::Status save_status;  // the cache file write after a successful tuning (OK if none)
};

// Counts since construction (monotonic), except `entries`.
struct ServerAutotuneCounters {
  uint64_t hits = 0;           // Lookup calls answered from the cache
  uint64_t misses = 0;         // Tune calls (no entry was cached when asked)
  uint64_t tunings = 0;        // tunings run by this process (successful or not)
  uint64_t tune_failures = 0;  // tunings that returned an error
  size_t entries = 0;          // tuned keys held now (loaded from the file + tuned)
};

// Callbacks for logs and metrics. Each may be empty. Called on the thread of the call that caused
// the event (a request or start-up); must be thread-safe and quick.
struct AutotuneObservers {
  std::function<void(bool hit)> on_lookup;               // one per Lookup hit or Tune call
  std::function<void(const AutotuneTuning&)> on_tuning;  // one per tuning this process ran
};

// Thread-safety: every method may be called concurrently.
class ServerAutotuner {
 public:
  // Loads `cache_path` ("" = memory only). A bad file is not fatal: see load_warning().
  ServerAutotuner(std::string cache_path, AutotuneObservers observers);

  ServerAutotuner(const ServerAutotuner&) = delete;
  ServerAutotuner& operator=(const ServerAutotuner&) = delete;

  // OK, or why the cache file was ignored at load (DATA_LOSS: unreadable or corrupt;
  // FAILED_PRECONDITION: another version). Report it once.
  const absl::Status& load_warning() const { return tuner_.load_warning(); }
  const std::string& cache_path() const { return tuner_.cache_path(); }
  // The underlying tuner, e.g. for the Benchmark RPC (its own counters are not ours).
  Autotuner& autotuner() { return tuner_; }

  // The cached configuration for `key`, counting a hit (and calling on_lookup(true)) when there
  // is one; nothing is counted on a miss (the caller then decides whether to Tune).
  std::optional<TunedConfig> Lookup(const TuneKey& key);

  // Counts a miss and returns the configuration for `key` through Autotuner::GetOrTune: `tune_fn`
  // runs at most once per key at a time (single flight; concurrent callers for the key wait for
  // it). When this call ran the tuning, on_tuning is called with its result, wall time and
  // `candidates`. Errors: tune_fn's (nothing is stored then; a later call tunes again).
  absl::StatusOr<TunedConfig> Tune(const TuneKey& key, int candidates, Autotuner::TuneFn tune_fn);

  ServerAutotuneCounters counters() const;

 private:
  Autotuner tuner_;
  const AutotuneObservers observers_;
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> misses_{0};
  std::atomic<uint64_t> tunings_{0};
  std::atomic<uint64_t> tune_failures_{0};
};

// One device and kernel variant to tune for, as Pretune sees it. The CUDA implementation is in
// server/cuda_autotune.h; tests use a fake.
class TuneTarget {
 public:
  virtual ~TuneTarget() = default;
  // The cache key of (shape, out_dtype) on this target.
  virtual TuneKey Key(const AwqShape& shape, DType out_dtype) const = 0;
  // Number of candidate launch configurations; at most 1 means there is nothing to tune.
  virtual int CandidateCount(const AwqShape& shape, DType out_dtype) const = 0;
  // Measures the candidates on scratch buffers and returns the winner.
  virtual absl::StatusOr<TuneEntry> TuneScratch(const AwqShape& shape, DType out_dtype) = 0;
};

// What Pretune did.
struct PretuneReport {
  int keys = 0;              // (shape, out dtype) pairs considered
  int tuned = 0;             // tuned now
  int cached = 0;            // already in the cache (e.g. from the file)
  int untunable = 0;         // a single candidate: nothing to tune
  int failed = 0;            // tunings that returned an error (the server still starts)
  absl::Status first_error;  // the first failure, OK if none
  double wall_seconds = 0;   // total host wall time, seconds
};

// Tunes every (shape, out_dtype) of `shapes` x `out_dtypes` on `target` that is not cached yet,
// one after another, through tuner.Lookup / tuner.Tune (so hits, misses and tunings are counted
// and observed as for requests). Failures are counted, not fatal.
PretuneReport Pretune(ServerAutotuner& tuner, TuneTarget& target, absl::Span<const AwqShape> shapes,
                      absl::Span<const DType> out_dtypes);

}  // namespace dequantd
