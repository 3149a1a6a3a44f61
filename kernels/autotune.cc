#include "kernels/autotune.h"

#include <utility>

namespace dequantd {

Autotuner::Autotuner(std::string cache_path) : cache_(std::move(cache_path)) {
  load_warning_ = cache_.Load();
}

absl::StatusOr<Autotuner::Result> Autotuner::GetOrTune(const TuneKey& key, TuneFn tune_fn) {
  if (std::optional<TuneEntry> hit = cache_.Lookup(key)) {
    hits_.fetch_add(1, std::memory_order_relaxed);
    return Result{*hit, false, absl::OkStatus()};
  }

  std::shared_ptr<Flight> flight;
  bool leader = false;
  {
    std::lock_guard lock(flights_mu_);
    // A tuning may have finished between the lookup above and taking the lock: the leader stores
    // its entry before retiring its flight, so one of the two checks below sees it.
    if (std::optional<TuneEntry> hit = cache_.Lookup(key)) {
      hits_.fetch_add(1, std::memory_order_relaxed);
      return Result{*hit, false, absl::OkStatus()};
    }
    misses_.fetch_add(1, std::memory_order_relaxed);
    auto [it, inserted] = flights_.try_emplace(key);
    if (inserted) it->second = std::make_shared<Flight>();
    flight = it->second;
    leader = inserted;
  }

  if (!leader) {
    std::unique_lock lock(flight->mu);
    flight->cv.wait(lock, [&] { return flight->done; });
    if (!flight->result.ok()) return flight->result.status();
    return Result{*flight->result, false, absl::OkStatus()};
  }

  tunes_.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<TuneEntry> tuned = tune_fn();
  if (tuned.ok()) {
    cache_.Insert(key, *tuned);
  } else {
    tune_failures_.fetch_add(1, std::memory_order_relaxed);
  }
  {
    std::lock_guard lock(flights_mu_);
    flights_.erase(key);
  }
  {
    std::lock_guard lock(flight->mu);
    flight->result = tuned;
    flight->done = true;
  }
  flight->cv.notify_all();
  if (!tuned.ok()) return tuned.status();

  // Persist after releasing the waiters: they need the entry, not the file.
  Result result{*tuned, true, cache_.Save()};
  if (!result.save_status.ok()) save_failures_.fetch_add(1, std::memory_order_relaxed);
  return result;
}

AutotuneCounters Autotuner::counters() const {
  AutotuneCounters c;
  c.hits = hits_.load(std::memory_order_relaxed);
  c.misses = misses_.load(std::memory_order_relaxed);
  c.tunes = tunes_.load(std::memory_order_relaxed);
  c.tune_failures = tune_failures_.load(std::memory_order_relaxed);
  c.save_failures = save_failures_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace dequantd
