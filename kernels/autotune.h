// The autotuner: one component that answers "which launch configuration for this launch?". A key
// (device, kernel variant, shape, dtypes, objective) is measured once (a tune function, e.g.
// kernels/cuda/autotune_cuda.h), then served from memory, and persisted through a TuneStore
// (formats/tune_store.h: a versioned JSON file shared between processes) so a restart does not
// tune again. Events go to an AutotuneObserver (server/metrics/metrics.h implements it).
// CPU-only: no CUDA headers, so everything here is tested on machines without a GPU.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cuda/launch_config.h"
#include "kernels/dequant.h"

namespace dequantd {

// What a tuning minimizes (docs/architecture.md "Autotuner" says which use takes which).
enum class TuneObjective : int {
  // One launch on its own, as a single-layer Dequantize call pays it: every timed launch waits
  // for the previous one to finish completely (no overlap of one launch's tail with the next).
  kLatency = 0,
  // Back-to-back launches, as a pass over many layers pays them: launches overlap as the stream
  // allows (programmatic dependent launch).
  kThroughput = 1,
};
// "latency", "throughput".
std::string_view TuneObjectiveName(TuneObjective objective);
// Inverse of TuneObjectiveName; false for other text.
bool ParseTuneObjective(std::string_view name, TuneObjective* out);

// What identifies a GPU in a key: cudaDeviceProp::name and major * 10 + minor.
struct TuneDevice {
  std::string name;            // e.g. "NVIDIA H200"
  int compute_capability = 0;  // e.g. 90
  bool operator==(const TuneDevice&) const = default;
};

// What a tuned configuration is for. Two keys are equal when every field is. Built by For only.
struct TuneKey {
  TuneDevice device;
  // FormatLabel(shape) (format_registry.h): FormatName, then "/nk" or "/kn" for an orientation
  // other than the format's own, "/b<bits>" for bits other than 4, "/f<flags>" for format flags,
  // "/r<rows>", "/e<E>": e.g. "awq_gemm", "awq_gemm/nk", "gptq/b8/f1", "mxfp4/e32".
  std::string format;
  std::string variant;  // kernel variant name, e.g. "v4_vec16" (cuda::VariantName)
  int64_t K = 0;        // in_features
  int64_t N = 0;        // out_features
  int64_t group_size = 0;
  DType scale_dtype = DType::kF16;   // fp16 or bf16
  DType output_dtype = DType::kF16;  // fp16, bf16 or fp32
  TuneObjective objective = TuneObjective::kLatency;

  // The key of one launch: `variant` of `shape` into `output_dtype` on `device`, for `objective`.
  static TuneKey For(TuneDevice device, std::string_view variant, const QuantShape& shape,
                     DType output_dtype, TuneObjective objective);

  bool operator==(const TuneKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const TuneKey& k) {
    return H::combine(std::move(h), k.device.name, k.device.compute_capability, k.format, k.variant,
                      k.K, k.N, k.group_size, k.scale_dtype, k.output_dtype, k.objective);
  }
  // "NVIDIA H200 sm90 awq_gemm v4_vec16 4096x14336 g128 fp16->fp16 latency", for logs.
  std::string ToString() const;
};

// One tuning result.
struct TuneEntry {
  cuda::LaunchConfig config;
  double seconds = 0;  // the winner's measured time per launch (median of rounds), seconds
  bool operator==(const TuneEntry&) const = default;
};

using TuneEntries = std::vector<std::pair<TuneKey, TuneEntry>>;

// Where tuned entries persist across processes. formats/tune_store.h implements it with a file;
// tests use a fake. Called by Autotuner only: once at construction (Load) and after each
// successful tuning (Merge), never concurrently with itself.
class TuneStore {
 public:
  virtual ~TuneStore() = default;
  // For logs, e.g. the file's path.
  virtual std::string Describe() const = 0;
  // The stored entries. A store that is not usable is a warning the caller reports once:
  // DATA_LOSS (unreadable or corrupt), FAILED_PRECONDITION (another format version).
  virtual absl::StatusOr<TuneEntries> Load() = 0;
  // Stores `entries` merged with what is stored now (a stored key that `entries` lacks is kept;
  // `entries` win for keys in both), atomically for other readers and writers. Returns the
  // stored entries whose keys `entries` lacked (what other processes tuned meanwhile).
  // INTERNAL when nothing could be written.
  virtual absl::StatusOr<TuneEntries> Merge(const TuneEntries& entries) = 0;
};

// Event counts since construction (monotonic), and the entries held now.
struct AutotuneCounters {
  uint64_t hits = 0;           // GetOrTune calls answered from memory
  uint64_t misses = 0;         // GetOrTune calls that found no entry (tuned, or waited for one)
  uint64_t tunings = 0;        // tune functions run by this process (successful or not)
  uint64_t tune_failures = 0;  // tune functions that returned an error
  uint64_t save_failures = 0;  // TuneStore::Merge calls that failed
  size_t entries = 0;          // tuned keys held now (loaded, tuned, merged from the store)
};

// One tuning that finished (successfully or not).
struct AutotuneTuning {
  TuneKey key;
  absl::StatusOr<TuneEntry> result = absl::UnknownError("not tuned");  // the winner, or why not
  double wall_seconds = 0;   // host wall time of the tune function, seconds
  int candidates = 0;        // candidate configurations it chose among
  absl::Status save_status;  // the store's Merge after a successful tuning (OK if none)
};

// Where the autotuner reports what it does (server/metrics/metrics.h implements it with Prometheus;
// the server adds its log lines). Called on the thread of the GetOrTune call that caused the event;
// implementations must be thread-safe and quick.
class AutotuneObserver {
 public:
  virtual ~AutotuneObserver() = default;
  // One GetOrTune call: answered from memory (`hit`) or not.
  virtual void ObserveLookup(bool hit) = 0;
  // One tuning this process ran, after its result was stored (or not).
  virtual void ObserveTuning(const AutotuneTuning& tuning) = 0;
  // The number of entries held changed (after loading, a tuning, or a merge), to `entries`.
  virtual void ObserveEntries(size_t entries) = 0;
};

// Thread-safety: every method may be called concurrently from any thread.
class Autotuner {
 public:
  // What GetOrTune returns.
  struct Result {
    TuneEntry entry;
    bool tuned = false;        // this call ran the tune function
    absl::Status save_status;  // when `tuned`: the store's Merge (non-OK: the entry is still
                               // served from memory); otherwise OK
  };
  // Measures the candidates for one key and returns the winner.
  using TuneFn = absl::FunctionRef<absl::StatusOr<TuneEntry>()>;

  // Loads `store` (null: memory only). A store that fails to load is not fatal: it is ignored
  // (its next Merge replaces it) and why is kept in load_warning(). `observer` (may be null)
  // must outlive the tuner; it gets ObserveEntries once here.
  explicit Autotuner(std::unique_ptr<TuneStore> store = nullptr,
                     AutotuneObserver* observer = nullptr);

  Autotuner(const Autotuner&) = delete;
  Autotuner& operator=(const Autotuner&) = delete;

  // OK, or why the store was ignored (see TuneStore::Load).
  const absl::Status& load_warning() const { return load_warning_; }
  // TuneStore::Describe(), or "" for memory only.
  const std::string& store_description() const { return store_description_; }

  // The configuration for `key`. Hit: a shared-lock hash lookup, no allocation. Miss: runs
  // `tune_fn` exactly once per key however many callers arrive concurrently (single flight: the
  // others wait for that run and share its result; callers for other keys are not blocked),
  // keeps the winner and merges it into the store. A tune_fn error goes to the caller that ran
  // it and to those waiting on it, and nothing is kept (a later call tunes again). `candidates`
  // (how many configurations tune_fn chooses among) is only reported to the observer.
  absl::StatusOr<Result> GetOrTune(const TuneKey& key, int candidates, TuneFn tune_fn);

  // The entry held for `key`, without tuning or counting.
  std::optional<TuneEntry> Peek(const TuneKey& key) const;

  AutotuneCounters counters() const;

 private:
  // One tuning in progress; waiters block on `cv` until `done`.
  struct Flight {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    absl::StatusOr<TuneEntry> result = absl::UnknownError("tuning did not finish");
  };

  // Adds `entries` whose keys are not held yet; returns the number held after.
  size_t AddMissing(TuneEntries entries);
  // Runs tune_fn as the leader of `key`'s flight and stores its result.
  absl::StatusOr<Result> Lead(const TuneKey& key, int candidates, TuneFn tune_fn, Flight& flight);
  void ObserveLookup(bool hit);

  const std::unique_ptr<TuneStore> store_;
  AutotuneObserver* const observer_;
  std::string store_description_;
  absl::Status load_warning_;

  mutable std::shared_mutex map_mu_;  // guards map_
  absl::flat_hash_map<TuneKey, TuneEntry> map_;

  std::mutex flights_mu_;  // guards flights_
  absl::flat_hash_map<TuneKey, std::shared_ptr<Flight>> flights_;

  std::mutex store_mu_;  // one Merge at a time

  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> misses_{0};
  std::atomic<uint64_t> tunings_{0};
  std::atomic<uint64_t> tune_failures_{0};
  std::atomic<uint64_t> save_failures_{0};
};

// ---- Choosing among measured candidates (the rule; the measuring is autotune_cuda.h). ----

// The rounds of one candidate: seconds per launch, one sample per round.
struct CandidateSamples {
  cuda::LaunchConfig config;
  std::vector<double> seconds;  // one value per round, > 0
};

// What ChooseCandidate decided.
struct CandidateChoice {
  size_t index = 0;      // into the candidates given: the choice
  size_t fastest = 0;    // the candidate with the lowest median
  double seconds = 0;    // the choice's median, seconds
  double tolerance = 0;  // relative margin a candidate had to beat to displace an earlier one
};

// The rule: each candidate's time is the median of its rounds; the fastest median wins unless a
// candidate earlier in the given order (the fixed, rule-based order of cuda::CandidateConfigs,
// DefaultConfig first) is within `tolerance` of it, in which case the earliest such one is
// chosen. tolerance = the fastest candidate's spread (interquartile range / median of its
// rounds), clamped to [min_tolerance, max_tolerance]: a challenger is kept only when it wins by
// more than the measured noise, so ties resolve the same way every time (toward the rule-based
// order), and the choice is never more than max_tolerance slower than the fastest median. The
// floor was raised from 0.25% to 0.5% because fresh tunings of one key on the H200 disagreed by
// more than the spread of their own rounds (up to 0.94% on a large layer; docs/performance.md,
// issue 13). INVALID_ARGUMENT for no candidates, a candidate without rounds or a non-positive
// sample.
absl::StatusOr<CandidateChoice> ChooseCandidate(absl::Span<const CandidateSamples> candidates,
                                                double min_tolerance = 0.005,
                                                double max_tolerance = 0.01);

// Median of `values` (not empty).
double Median(std::vector<double> values);

}  // namespace dequantd
