#include "kernels/autotune.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/autotune/cache_dir_fixture.h"
#include "tests/autotune/test_helpers.h"

namespace dequantd {
namespace {

namespace fs = std::filesystem;

using autotune_testing::Key;

class AutotunerTest : public autotune_testing::CacheDirTest {};

TEST_F(AutotunerTest, EightConcurrentCallersTuneOnce) {
  constexpr int kThreads = 8;
  Autotuner tuner(path_);
  ASSERT_TRUE(tuner.load_warning().ok());
  std::atomic<int> tune_calls{0};
  const TuneEntry winner{TunedConfig{512, 4, 2}, 3e-5};
  auto tune_fn = [&]() -> absl::StatusOr<TuneEntry> {
    ++tune_calls;
    // Hold the flight open until every caller has missed (and so waits on this run).
    while (tuner.counters().misses < kThreads) std::this_thread::yield();
    return winner;
  };
  std::vector<absl::StatusOr<Autotuner::Result>> results(kThreads, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] { results[i] = tuner.GetOrTune(Key(4096, 14336), tune_fn); });
  }
  for (std::thread& t : threads) t.join();

  EXPECT_EQ(tune_calls.load(), 1);
  int tuned = 0;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->entry, winner);
    tuned += r->tuned ? 1 : 0;
  }
  EXPECT_EQ(tuned, 1);
  const AutotuneCounters c = tuner.counters();
  EXPECT_EQ(c.hits, 0u);
  EXPECT_EQ(c.misses, 8u);
  EXPECT_EQ(c.tunes, 1u);
  EXPECT_EQ(c.tune_failures, 0u);

  // Later calls hit.
  absl::StatusOr<Autotuner::Result> again = tuner.GetOrTune(
      Key(4096, 14336),
      []() -> absl::StatusOr<TuneEntry> { return absl::InternalError("must not tune"); });
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->tuned);
  EXPECT_EQ(again->entry, winner);
  EXPECT_EQ(tuner.counters().hits, 1u);
}

// A tuning in progress for one key does not block a tuning for another key.
TEST_F(AutotunerTest, OtherKeysProceedWhileOneTunes) {
  Autotuner tuner("");
  std::mutex mu;
  std::condition_variable cv;
  bool b_done = false;
  std::thread a([&] {
    absl::StatusOr<Autotuner::Result> r =
        tuner.GetOrTune(Key(1536, 1536), [&]() -> absl::StatusOr<TuneEntry> {
          std::unique_lock lock(mu);
          // Only finishes once key B has been tuned; a global lock would never get there.
          if (!cv.wait_for(lock, std::chrono::seconds(30), [&] { return b_done; })) {
            return absl::DeadlineExceededError("key B was blocked by key A");
          }
          return TuneEntry{TunedConfig{128, 1, 1}, 1e-5};
        });
    EXPECT_TRUE(r.ok()) << r.status();
  });
  while (tuner.counters().tunes < 1) std::this_thread::yield();  // A is tuning
  absl::StatusOr<Autotuner::Result> b =
      tuner.GetOrTune(Key(4096, 4096), []() -> absl::StatusOr<TuneEntry> {
        return TuneEntry{TunedConfig{256, 2, 1}, 2e-5};
      });
  ASSERT_TRUE(b.ok());
  {
    std::lock_guard lock(mu);
    b_done = true;
  }
  cv.notify_all();
  a.join();
  EXPECT_EQ(tuner.counters().tunes, 2u);
  EXPECT_EQ(tuner.size(), 2u);
}

TEST_F(AutotunerTest, RestartHitsWithoutTuning) {
  const TuneEntry winner{TunedConfig{256, 4, 1}, 1.5e-5};
  {
    Autotuner tuner(path_);
    absl::StatusOr<Autotuner::Result> r =
        tuner.GetOrTune(Key(8192, 28672), [&]() -> absl::StatusOr<TuneEntry> { return winner; });
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->tuned);
    EXPECT_TRUE(r->save_status.ok()) << r->save_status;
  }
  Autotuner restarted(path_);
  ASSERT_TRUE(restarted.load_warning().ok());
  bool called = false;
  absl::StatusOr<Autotuner::Result> r =
      restarted.GetOrTune(Key(8192, 28672), [&]() -> absl::StatusOr<TuneEntry> {
        called = true;
        return TuneEntry{};
      });
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(called);
  EXPECT_FALSE(r->tuned);
  EXPECT_EQ(r->entry, winner);
  const AutotuneCounters c = restarted.counters();
  EXPECT_EQ(c.hits, 1u);
  EXPECT_EQ(c.misses, 0u);
  EXPECT_EQ(c.tunes, 0u);
}

TEST_F(AutotunerTest, TuneErrorIsReturnedAndNotCached) {
  Autotuner tuner(path_);
  absl::StatusOr<Autotuner::Result> failed = tuner.GetOrTune(
      Key(8, 8),
      []() -> absl::StatusOr<TuneEntry> { return absl::InternalError("cudaLaunchKernel failed"); });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(tuner.Lookup(Key(8, 8)).has_value());
  EXPECT_FALSE(fs::exists(path_));

  absl::StatusOr<Autotuner::Result> retried =
      tuner.GetOrTune(Key(8, 8), []() -> absl::StatusOr<TuneEntry> {
        return TuneEntry{TunedConfig{64, 1, 1}, 1e-6};
      });
  ASSERT_TRUE(retried.ok());
  EXPECT_TRUE(retried->tuned);
  const AutotuneCounters c = tuner.counters();
  EXPECT_EQ(c.tunes, 2u);
  EXPECT_EQ(c.tune_failures, 1u);
}

TEST_F(AutotunerTest, CorruptFileIsAWarningAndGetsReplaced) {
  std::ofstream(path_) << "not json at all";
  Autotuner tuner(path_);
  EXPECT_EQ(tuner.load_warning().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(tuner.size(), 0u);
  absl::StatusOr<Autotuner::Result> r =
      tuner.GetOrTune(Key(1536, 8960), []() -> absl::StatusOr<TuneEntry> {
        return TuneEntry{TunedConfig{128, 2, 2}, 9e-6};
      });
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->save_status.ok()) << r->save_status;

  Autotuner restarted(path_);
  EXPECT_TRUE(restarted.load_warning().ok()) << restarted.load_warning();
  EXPECT_EQ(restarted.Lookup(Key(1536, 8960)), (TuneEntry{TunedConfig{128, 2, 2}, 9e-6}));
}

TEST_F(AutotunerTest, SaveFailureIsReportedAndTheEntryStillServes) {
  Autotuner tuner("/dev/null/dequantd/cache.json");
  absl::StatusOr<Autotuner::Result> r =
      tuner.GetOrTune(Key(8, 8), []() -> absl::StatusOr<TuneEntry> {
        return TuneEntry{TunedConfig{}, 1e-6};
      });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->save_status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(tuner.counters().save_failures, 1u);
  EXPECT_TRUE(tuner.Lookup(Key(8, 8)).has_value());
}

}  // namespace
}  // namespace dequantd
