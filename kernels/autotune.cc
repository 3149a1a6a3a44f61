#include "kernels/autotune.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/format_registry.h"

namespace dequantd {

std::string_view TuneObjectiveName(TuneObjective objective) {
  return objective == TuneObjective::kThroughput ? "throughput" : "latency";
}

bool ParseTuneObjective(std::string_view name, TuneObjective* out) {
  for (TuneObjective o : {TuneObjective::kLatency, TuneObjective::kThroughput}) {
    if (name == TuneObjectiveName(o)) {
      *out = o;
      return true;
    }
  }
  return false;
}

TuneKey TuneKey::For(TuneDevice device, std::string_view variant, const QuantShape& shape,
                     DType output_dtype, TuneObjective objective) {
  TuneKey key;
  key.device = std::move(device);
  // The format's name, then what of the shape besides K, N, G and the scale dtype changes the
  // kernel: the orientation when it is not the format's own, the bits when not 4, the flags and the
  // scale block rows when set, the experts when not 1 (mxfp4). So every key of the formats before
  // reads as before (the file's version is unchanged: no existing entry changes meaning).
  key.format = std::string(FormatName(shape.format));
  if (shape.orientation != FormatRowOf(shape.format).default_orientation)
    absl::StrAppend(&key.format, "/", std::string(OrientationName(shape.orientation)));
  if (shape.bits != 4) absl::StrAppend(&key.format, "/b", shape.bits);
  if (shape.format_flags != 0) absl::StrAppend(&key.format, "/f", shape.format_flags);
  if (shape.scale_block_rows > 1) absl::StrAppend(&key.format, "/r", shape.scale_block_rows);
  if (shape.experts != 1) absl::StrAppend(&key.format, "/e", shape.experts);
  key.variant = std::string(variant);
  key.K = shape.K;
  key.N = shape.N;
  key.group_size = shape.group_size;
  key.scale_dtype = shape.scale_dtype;
  key.output_dtype = output_dtype;
  key.objective = objective;
  return key;
}

std::string TuneKey::ToString() const {
  return absl::StrCat(device.name, " sm", device.compute_capability, " ", format, " ", variant, " ",
                      K, "x", N, " g", group_size, " ", std::string(DTypeName(scale_dtype)), "->",
                      std::string(DTypeName(output_dtype)), " ",
                      std::string(TuneObjectiveName(objective)));
}

Autotuner::Autotuner(std::unique_ptr<TuneStore> store, AutotuneObserver* observer)
    : store_(std::move(store)), observer_(observer) {
  size_t held = 0;
  if (store_ != nullptr) {
    store_description_ = store_->Describe();
    absl::StatusOr<TuneEntries> loaded = store_->Load();
    if (loaded.ok()) {
      held = AddMissing(*std::move(loaded));
    } else {
      load_warning_ = loaded.status();
    }
  }
  if (observer_ != nullptr) observer_->ObserveEntries(held);
}

size_t Autotuner::AddMissing(TuneEntries entries) {
  std::unique_lock lock(map_mu_);
  for (auto& [key, entry] : entries) map_.try_emplace(std::move(key), entry);
  return map_.size();
}

std::optional<TuneEntry> Autotuner::Peek(const TuneKey& key) const {
  std::shared_lock lock(map_mu_);
  const auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

void Autotuner::ObserveLookup(bool hit) {
  (hit ? hits_ : misses_).fetch_add(1, std::memory_order_relaxed);
  if (observer_ != nullptr) observer_->ObserveLookup(hit);
}

absl::StatusOr<Autotuner::Result> Autotuner::GetOrTune(const TuneKey& key, int candidates,
                                                       TuneFn tune_fn) {
  if (std::optional<TuneEntry> hit = Peek(key)) {
    ObserveLookup(true);
    return Result{*hit, false, absl::OkStatus()};
  }
  std::shared_ptr<Flight> flight;
  bool leader = false;
  {
    std::lock_guard lock(flights_mu_);
    // A tuning may have finished between the lookup above and taking the lock: the leader keeps
    // its entry before retiring its flight, so one of the two lookups sees it.
    if (std::optional<TuneEntry> hit = Peek(key)) {
      ObserveLookup(true);
      return Result{*hit, false, absl::OkStatus()};
    }
    auto [it, inserted] = flights_.try_emplace(key);
    if (inserted) it->second = std::make_shared<Flight>();
    flight = it->second;
    leader = inserted;
  }
  ObserveLookup(false);
  if (leader) return Lead(key, candidates, tune_fn, *flight);

  std::unique_lock lock(flight->mu);
  flight->cv.wait(lock, [&] { return flight->done; });
  if (!flight->result.ok()) return flight->result.status();
  return Result{*flight->result, false, absl::OkStatus()};
}

absl::StatusOr<Autotuner::Result> Autotuner::Lead(const TuneKey& key, int candidates,
                                                  TuneFn tune_fn, Flight& flight) {
  tunings_.fetch_add(1, std::memory_order_relaxed);
  AutotuneTuning tuning;
  tuning.key = key;
  tuning.candidates = candidates;
  const auto start = std::chrono::steady_clock::now();
  tuning.result = tune_fn();
  tuning.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  size_t held = 0;
  if (tuning.result.ok()) {
    std::unique_lock lock(map_mu_);
    map_.insert_or_assign(key, *tuning.result);
    held = map_.size();
  } else {
    tune_failures_.fetch_add(1, std::memory_order_relaxed);
  }
  {
    std::lock_guard lock(flights_mu_);
    flights_.erase(key);
  }
  {
    std::lock_guard lock(flight.mu);
    flight.result = tuning.result;
    flight.done = true;
  }
  flight.cv.notify_all();

  // Persist after releasing the waiters: they need the entry, not the file.
  if (tuning.result.ok() && store_ != nullptr) {
    std::lock_guard lock(store_mu_);
    TuneEntries snapshot;
    {
      std::shared_lock map_lock(map_mu_);
      snapshot.assign(map_.begin(), map_.end());
    }
    absl::StatusOr<TuneEntries> others = store_->Merge(snapshot);
    if (others.ok()) {
      held = AddMissing(*std::move(others));
    } else {
      tuning.save_status = others.status();
      save_failures_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (observer_ != nullptr) {
    if (tuning.result.ok()) observer_->ObserveEntries(held);
    observer_->ObserveTuning(tuning);
  }
  if (!tuning.result.ok()) return tuning.result.status();
  return Result{*tuning.result, true, tuning.save_status};
}

AutotuneCounters Autotuner::counters() const {
  AutotuneCounters c;
  c.hits = hits_.load(std::memory_order_relaxed);
  c.misses = misses_.load(std::memory_order_relaxed);
  c.tunings = tunings_.load(std::memory_order_relaxed);
  c.tune_failures = tune_failures_.load(std::memory_order_relaxed);
  c.save_failures = save_failures_.load(std::memory_order_relaxed);
  std::shared_lock lock(map_mu_);
  c.entries = map_.size();
  return c;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

namespace {

// Interquartile range / median of `values` (not empty): the relative noise of one candidate.
double RelativeSpread(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  const double q1 = values[n / 4];
  const double q3 = values[n - 1 - n / 4];
  return (q3 - q1) / Median(values);
}

}  // namespace

absl::StatusOr<CandidateChoice> ChooseCandidate(absl::Span<const CandidateSamples> candidates,
                                                double min_tolerance, double max_tolerance) {
  if (candidates.empty()) return absl::InvalidArgumentError("no candidates to choose from");
  std::vector<double> medians;
  for (const CandidateSamples& c : candidates) {
    if (c.seconds.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("candidate ", c.config.ToString(), " has no timed rounds"));
    }
    for (double s : c.seconds) {
      if (!(s > 0) || !std::isfinite(s)) {
        return absl::InvalidArgumentError(
            absl::StrCat("candidate ", c.config.ToString(), " has a sample of ", s, " s"));
      }
    }
    medians.push_back(Median(c.seconds));
  }
  CandidateChoice choice;
  choice.fastest =
      static_cast<size_t>(std::min_element(medians.begin(), medians.end()) - medians.begin());
  choice.tolerance =
      std::clamp(RelativeSpread(candidates[choice.fastest].seconds), min_tolerance, max_tolerance);
  const double limit = medians[choice.fastest] * (1 + choice.tolerance);
  choice.index = choice.fastest;
  for (size_t i = 0; i < choice.fastest; ++i) {
    if (medians[i] <= limit) {
      choice.index = i;
      break;
    }
  }
  choice.seconds = medians[choice.index];
  return choice;
}

}  // namespace dequantd
