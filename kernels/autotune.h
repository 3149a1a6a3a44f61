// The autotuner: the launch configuration for a key (device, kernel variant, shape, dtypes) is
// measured once (tune_fn), then served from memory and from the cache file across restarts.
// CPU-only; the CUDA measuring side is kernels/cuda/autotune_cuda.h.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/tune_cache.h"

namespace dequantd {

// Event counts since construction (monotonic).
struct AutotuneCounters {
  uint64_t hits = 0;    // GetOrTune calls answered from the cache
  uint64_t misses = 0;  // GetOrTune calls that found no entry (tuned, or waited for a tuning)
  uint64_t tunes = 0;   // tune_fn runs
  uint64_t tune_failures = 0;  // tune_fn runs that returned an error
  uint64_t save_failures = 0;  // cache file writes that failed
};

// Thread-safety: every method may be called concurrently from any thread.
class Autotuner {
 public:
  // What GetOrTune returns.
  struct Result {
    TuneEntry entry;
    bool tuned = false;        // this call ran tune_fn
    absl::Status save_status;  // when `tuned`: the cache file write (non-OK: report it; the entry
                               // is still used from memory); otherwise OK
  };
  // Measures the candidates for one key and returns the winner.
  using TuneFn = absl::FunctionRef<absl::StatusOr<TuneEntry>()>;

  // Loads `cache_path` (empty: memory only). A bad file is not fatal: it is ignored and its
  // warning kept in load_warning() for the caller to report once.
  explicit Autotuner(std::string cache_path);

  Autotuner(const Autotuner&) = delete;
  Autotuner& operator=(const Autotuner&) = delete;

  // OK, or the TuneCache::Load warning (DATA_LOSS: corrupt/unreadable; FAILED_PRECONDITION:
  // other version).
  const absl::Status& load_warning() const { return load_warning_; }
  const std::string& cache_path() const { return cache_.path(); }

  // The configuration for `key`. Cache hit: a shared-lock hash lookup, no allocation. Miss: runs
  // `tune_fn` exactly once per key however many callers arrive concurrently (single flight: the
  // others wait for that run and get its result; callers for other keys are not blocked), stores
  // the winner and persists the cache file. A tune_fn error is returned to the caller that ran it
  // and to those waiting on it, and nothing is stored (a later call tunes again).
  absl::StatusOr<Result> GetOrTune(const TuneKey& key, TuneFn tune_fn);

  // The cached entry without tuning or counting (e.g. to fall back to a default while tuning).
  std::optional<TuneEntry> Lookup(const TuneKey& key) const { return cache_.Lookup(key); }

  // Number of tuned keys held (loaded or tuned).
  size_t size() const { return cache_.size(); }

  AutotuneCounters counters() const;

 private:
  // One tuning in progress; waiters block on `cv` until `done`.
  struct Flight {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    absl::StatusOr<TuneEntry> result = absl::UnknownError("tuning did not finish");
  };

  TuneCache cache_;
  absl::Status load_warning_;

  std::mutex flights_mu_;  // guards flights_
  absl::flat_hash_map<TuneKey, std::shared_ptr<Flight>> flights_;

  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> misses_{0};
  std::atomic<uint64_t> tunes_{0};
  std::atomic<uint64_t> tune_failures_{0};
  std::atomic<uint64_t> save_failures_{0};
};

}  // namespace dequantd
