// ServerAutotuner, Pretune and their helpers (see server_autotuner.h).
#include "server/server_autotuner.h"

#include <chrono>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dequantd {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

TuneKey MakeServerTuneKey(const TuneDevice& device, std::string_view variant, const AwqShape& shape,
                          DType out_dtype) {
  return TuneKey::For(device.name, device.compute_capability, variant, shape, out_dtype);
}

std::string TunedConfigToString(const TunedConfig& config) {
  return absl::StrCat("block=", config.block_size, ",words=", config.words_per_thread,
                      ",rows=", config.rows_per_thread);
}

std::string ResolveTuneCachePath(const std::string& flag) {
  return flag.empty() ? DefaultTuneCachePath() : flag;
}

absl::Status CreateTuneCacheDirectory(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) return absl::OkStatus();
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create the tune cache directory \"",
                                            dir.string(), "\": ", error.message()));
  }
  return absl::OkStatus();
}

std::vector<AwqShape> DistinctLayerShapes(absl::Span<const QuantizedLayer> layers) {
  std::vector<AwqShape> shapes;
  for (const QuantizedLayer& layer : layers) {
    const AwqShape& s = layer.view.shape;
    bool seen = false;
    for (const AwqShape& t : shapes) {
      if (t.K == s.K && t.N == s.N && t.group_size == s.group_size &&
          t.scale_dtype == s.scale_dtype) {
        seen = true;
        break;
      }
    }
    if (!seen) shapes.push_back(AwqShape{s.K, s.N, s.group_size, s.scale_dtype});
  }
  return shapes;
}

ServerAutotuner::ServerAutotuner(std::string cache_path, AutotuneObservers observers)
    : tuner_(std::move(cache_path)), observers_(std::move(observers)) {}

std::optional<TunedConfig> ServerAutotuner::Lookup(const TuneKey& key) {
  std::optional<TuneEntry> entry = tuner_.Lookup(key);
  if (!entry.has_value()) return std::nullopt;
  hits_.fetch_add(1, std::memory_order_relaxed);
  if (observers_.on_lookup) observers_.on_lookup(true);
  return entry->config;
}

absl::StatusOr<TunedConfig> ServerAutotuner::Tune(const TuneKey& key, int candidates,
                                                  Autotuner::TuneFn tune_fn) {
  misses_.fetch_add(1, std::memory_order_relaxed);
  if (observers_.on_lookup) observers_.on_lookup(false);

  // Whether this call ran the tuning (single flight: waiters do not), and how it went.
  AutotuneTuning tuning;
  tuning.key = key;
  tuning.candidates = candidates;
  bool ran = false;
  auto timed_tune = [&]() -> absl::StatusOr<TuneEntry> {
    ran = true;
    const Clock::time_point start = Clock::now();
    absl::StatusOr<TuneEntry> entry = tune_fn();
    tuning.wall_seconds = SecondsSince(start);
    tuning.result = entry;
    return entry;
  };
  absl::StatusOr<Autotuner::Result> result = tuner_.GetOrTune(key, timed_tune);
  if (ran) {
    tunings_.fetch_add(1, std::memory_order_relaxed);
    if (!tuning.result.ok()) tune_failures_.fetch_add(1, std::memory_order_relaxed);
    if (result.ok()) tuning.save_status = result->save_status;
    if (observers_.on_tuning) observers_.on_tuning(tuning);
  }
  if (!result.ok()) return result.status();
  return result->entry.config;
}

ServerAutotuneCounters ServerAutotuner::counters() const {
  ServerAutotuneCounters c;
  c.hits = hits_.load(std::memory_order_relaxed);
  c.misses = misses_.load(std::memory_order_relaxed);
  c.tunings = tunings_.load(std::memory_order_relaxed);
  c.tune_failures = tune_failures_.load(std::memory_order_relaxed);
  c.entries = tuner_.size();
  return c;
}

PretuneReport Pretune(ServerAutotuner& tuner, TuneTarget& target, absl::Span<const AwqShape> shapes,
                      absl::Span<const DType> out_dtypes) {
  PretuneReport report;
  const Clock::time_point start = Clock::now();
  for (const AwqShape& shape : shapes) {
    for (DType out_dtype : out_dtypes) {
      ++report.keys;
      const int candidates = target.CandidateCount(shape, out_dtype);
      if (candidates <= 1) {
        ++report.untunable;
        continue;
      }
      const TuneKey key = target.Key(shape, out_dtype);
      if (tuner.Lookup(key).has_value()) {
        ++report.cached;
        continue;
      }
      absl::StatusOr<TunedConfig> config =
          tuner.Tune(key, candidates, [&] { return target.TuneScratch(shape, out_dtype); });
      if (config.ok()) {
        ++report.tuned;
      } else {
        ++report.failed;
        if (report.first_error.ok()) {
          report.first_error =
              absl::Status(config.status().code(),
                           absl::StrCat(key.ToString(), ": ", config.status().message()));
        }
      }
    }
  }
  report.wall_seconds = SecondsSince(start);
  return report;
}

}  // namespace dequantd
