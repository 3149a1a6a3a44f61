// Micro-benchmark of the autotuner's hit path (issue 3: a cache hit costs under a microsecond).
//   build-*/bench/autotune_hit_benchmark
#include <string>

#include "benchmark/benchmark.h"
#include "kernels/autotune.h"
#include "tests/autotune/test_helpers.h"

namespace dequantd {
namespace {

using autotune_testing::Key;

// A tuner holding a model's worth of keys (9 shapes x 3 dtypes x 4 variants would be ~100).
Autotuner& FilledTuner() {
  static Autotuner* tuner = [] {
    auto* t = new Autotuner();
    for (int i = 1; i <= 256; ++i) {
      (void)t->GetOrTune(Key(128 * i, 8 * i), 5, []() -> absl::StatusOr<TuneEntry> {
        return autotune_testing::Entry(256, 4, 2, 1e-5);
      });
    }
    return t;
  }();
  return *tuner;
}

void BM_GetOrTuneHit(benchmark::State& state) {
  Autotuner& tuner = FilledTuner();
  const TuneKey key = Key(128 * 77, 8 * 77);
  for (auto _ : state) {
    absl::StatusOr<Autotuner::Result> r = tuner.GetOrTune(
        key, 5, []() -> absl::StatusOr<TuneEntry> { return absl::InternalError("must not tune"); });
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_GetOrTuneHit)->ThreadRange(1, 2);

void BM_PeekHit(benchmark::State& state) {
  Autotuner& tuner = FilledTuner();
  const TuneKey key = Key(128 * 77, 8 * 77);
  for (auto _ : state) benchmark::DoNotOptimize(tuner.Peek(key));
}
BENCHMARK(BM_PeekHit);

}  // namespace
}  // namespace dequantd

BENCHMARK_MAIN();
