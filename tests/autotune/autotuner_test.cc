// The autotuner (kernels/autotune.h) with its file store (formats/tune_store.h): single flight,
// counters, the observer, restarts, bad files, and entries merged from other processes.
#include "kernels/autotune.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "formats/tune_store.h"
#include "gtest/gtest.h"
#include "kernels/mxfp4_format.h"
#include "tests/autotune/cache_dir_fixture.h"
#include "tests/autotune/test_helpers.h"

namespace dequantd {
namespace {

namespace fs = std::filesystem;

using autotune_testing::Entry;
using autotune_testing::Key;

class AutotunerTest : public autotune_testing::CacheDirTest {
 protected:
  std::unique_ptr<TuneStore> File() { return std::make_unique<formats::TuneFile>(path_); }
};

// A tune function that must not run.
absl::StatusOr<TuneEntry> MustNotTune() { return absl::InternalError("must not tune"); }

TEST_F(AutotunerTest, EightConcurrentCallersTuneOnce) {
  constexpr int kThreads = 8;
  Autotuner tuner(File());
  ASSERT_TRUE(tuner.load_warning().ok());
  std::atomic<int> tune_calls{0};
  const TuneEntry winner = Entry(512, 4, 2, 3e-5);
  auto tune_fn = [&]() -> absl::StatusOr<TuneEntry> {
    ++tune_calls;
    // Hold the flight open until every caller has missed (and so waits on this run).
    while (tuner.counters().misses < kThreads) std::this_thread::yield();
    return winner;
  };
  std::vector<absl::StatusOr<Autotuner::Result>> results(kThreads, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] { results[i] = tuner.GetOrTune(Key(4096, 14336), 5, tune_fn); });
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
  AutotuneCounters c = tuner.counters();
  EXPECT_EQ(c.hits, 0u);
  EXPECT_EQ(c.misses, 8u);
  EXPECT_EQ(c.tunings, 1u);
  EXPECT_EQ(c.tune_failures, 0u);
  EXPECT_EQ(c.entries, 1u);

  // Later calls hit.
  absl::StatusOr<Autotuner::Result> again = tuner.GetOrTune(Key(4096, 14336), 5, MustNotTune);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->tuned);
  EXPECT_EQ(again->entry, winner);
  EXPECT_EQ(tuner.counters().hits, 1u);
}

// A tuning in progress for one key does not block a tuning for another key.
TEST_F(AutotunerTest, OtherKeysProceedWhileOneTunes) {
  Autotuner tuner;
  std::mutex mu;
  std::condition_variable cv;
  bool b_done = false;
  std::thread a([&] {
    absl::StatusOr<Autotuner::Result> r =
        tuner.GetOrTune(Key(1536, 1536), 5, [&]() -> absl::StatusOr<TuneEntry> {
          std::unique_lock lock(mu);
          // Only finishes once key B has been tuned; a global lock would never get there.
          if (!cv.wait_for(lock, std::chrono::seconds(30), [&] { return b_done; })) {
            return absl::DeadlineExceededError("key B was blocked by key A");
          }
          return Entry(128, 1, 1, 1e-5);
        });
    EXPECT_TRUE(r.ok()) << r.status();
  });
  while (tuner.counters().tunings < 1) std::this_thread::yield();  // A is tuning
  absl::StatusOr<Autotuner::Result> b = tuner.GetOrTune(
      Key(4096, 4096), 5, []() -> absl::StatusOr<TuneEntry> { return Entry(256, 2, 1, 2e-5); });
  ASSERT_TRUE(b.ok());
  {
    std::lock_guard lock(mu);
    b_done = true;
  }
  cv.notify_all();
  a.join();
  EXPECT_EQ(tuner.counters().tunings, 2u);
  EXPECT_EQ(tuner.counters().entries, 2u);
}

TEST_F(AutotunerTest, RestartHitsWithoutTuning) {
  const TuneEntry winner = Entry(256, 4, 1, 1.5e-5);
  {
    Autotuner tuner(File());
    absl::StatusOr<Autotuner::Result> r =
        tuner.GetOrTune(Key(8192, 28672), 5, [&]() -> absl::StatusOr<TuneEntry> { return winner; });
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->tuned);
    EXPECT_TRUE(r->save_status.ok()) << r->save_status;
  }
  Autotuner restarted(File());
  ASSERT_TRUE(restarted.load_warning().ok());
  EXPECT_EQ(restarted.store_description(), path_);
  EXPECT_EQ(restarted.counters().entries, 1u);
  absl::StatusOr<Autotuner::Result> r = restarted.GetOrTune(Key(8192, 28672), 5, MustNotTune);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->tuned);
  EXPECT_EQ(r->entry, winner);
  const AutotuneCounters c = restarted.counters();
  EXPECT_EQ(c.hits, 1u);
  EXPECT_EQ(c.misses, 0u);
  EXPECT_EQ(c.tunings, 0u);
}

TEST_F(AutotunerTest, TuneErrorIsReturnedAndNotKept) {
  Autotuner tuner(File());
  absl::StatusOr<Autotuner::Result> failed = tuner.GetOrTune(
      Key(8, 8), 5,
      []() -> absl::StatusOr<TuneEntry> { return absl::InternalError("cudaLaunchKernel failed"); });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(tuner.Peek(Key(8, 8)).has_value());
  EXPECT_FALSE(fs::exists(path_));

  absl::StatusOr<Autotuner::Result> retried = tuner.GetOrTune(
      Key(8, 8), 5, []() -> absl::StatusOr<TuneEntry> { return Entry(64, 1, 1, 1e-6); });
  ASSERT_TRUE(retried.ok());
  EXPECT_TRUE(retried->tuned);
  const AutotuneCounters c = tuner.counters();
  EXPECT_EQ(c.tunings, 2u);
  EXPECT_EQ(c.tune_failures, 1u);
  EXPECT_EQ(c.misses, 2u);
}

TEST_F(AutotunerTest, CorruptFileIsAWarningAndGetsReplaced) {
  std::ofstream(path_) << "not json at all";
  Autotuner tuner(File());
  EXPECT_EQ(tuner.load_warning().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(tuner.counters().entries, 0u);
  absl::StatusOr<Autotuner::Result> r = tuner.GetOrTune(
      Key(1536, 8960), 5, []() -> absl::StatusOr<TuneEntry> { return Entry(128, 2, 2, 9e-6); });
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->save_status.ok()) << r->save_status;

  Autotuner restarted(File());
  EXPECT_TRUE(restarted.load_warning().ok()) << restarted.load_warning();
  EXPECT_EQ(restarted.Peek(Key(1536, 8960)), Entry(128, 2, 2, 9e-6));
}

// A cache file of the previous format (version 1) is ignored cleanly: a FAILED_PRECONDITION
// warning, nothing served from it (the key is tuned again), and a version-2 file afterwards.
TEST_F(AutotunerTest, Version1FileIsIgnoredAndRetuned) {
  std::ofstream(path_) << R"({"version": 1, "entries": [
    {"device": "NVIDIA H200", "compute_capability": 90, "variant": "v4_vec16",
     "K": 4096, "N": 4096, "group_size": 128, "scale_dtype": "fp16", "output_dtype": "fp16",
     "config": {"block_size": 512, "words_per_thread": 1, "rows_per_thread": 16},
     "seconds": 2.5e-05}]})";
  Autotuner tuner(File());
  EXPECT_EQ(tuner.load_warning().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tuner.counters().entries, 0u);
  int runs = 0;
  absl::StatusOr<Autotuner::Result> r =
      tuner.GetOrTune(Key(4096, 4096), 5, [&]() -> absl::StatusOr<TuneEntry> {
        ++runs;
        return Entry(128, 1, 2, 2e-5);
      });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(r->save_status.ok()) << r->save_status;
  Autotuner restarted(File());
  EXPECT_TRUE(restarted.load_warning().ok()) << restarted.load_warning();
  EXPECT_EQ(restarted.Peek(Key(4096, 4096)), Entry(128, 1, 2, 2e-5));
}

TEST_F(AutotunerTest, SaveFailureIsReportedAndTheEntryStillServes) {
  Autotuner tuner(std::make_unique<formats::TuneFile>("/dev/null/dequantd/cache.json"));
  absl::StatusOr<Autotuner::Result> r = tuner.GetOrTune(
      Key(8, 8), 5, []() -> absl::StatusOr<TuneEntry> { return Entry(256, 1, 1, 1e-6); });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->save_status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(tuner.counters().save_failures, 1u);
  EXPECT_EQ(tuner.Peek(Key(8, 8)), Entry(256, 1, 1, 1e-6));
}

// Two tuners on one file (two server processes): the second one's write brings in the first
// one's entry, which it then serves without tuning.
TEST_F(AutotunerTest, EntriesOfAnotherProcessArePickedUpOnWrite) {
  Autotuner a(File()), b(File());
  ASSERT_TRUE(a.GetOrTune(Key(1536, 1536), 5, [] {
                 return absl::StatusOr<TuneEntry>(Entry(128, 1, 4, 3e-6));
               }).ok());
  ASSERT_TRUE(b.GetOrTune(Key(4096, 4096), 5, [] {
                 return absl::StatusOr<TuneEntry>(Entry(128, 1, 2, 2e-5));
               }).ok());
  EXPECT_EQ(b.counters().entries, 2u);
  absl::StatusOr<Autotuner::Result> r = b.GetOrTune(Key(1536, 1536), 5, MustNotTune);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->entry, Entry(128, 1, 4, 3e-6));
}

// Records the observer calls.
class RecordingObserver final : public AutotuneObserver {
 public:
  void ObserveLookup(bool hit) override {
    std::lock_guard lock(mu);
    ++(hit ? hits : misses);
  }
  void ObserveTuning(const AutotuneTuning& t) override {
    std::lock_guard lock(mu);
    tunings.push_back(t);
  }
  void ObserveEntries(size_t n) override {
    std::lock_guard lock(mu);
    entries.push_back(n);
  }

  std::mutex mu;
  int hits = 0, misses = 0;
  std::vector<AutotuneTuning> tunings;
  std::vector<size_t> entries;  // every ObserveEntries value, in order
};

TEST_F(AutotunerTest, ObserverSeesLookupsTuningsAndEntries) {
  RecordingObserver rec;
  {
    Autotuner tuner(File(), &rec);
    ASSERT_EQ(rec.entries, std::vector<size_t>{0});  // after loading: nothing
    ASSERT_TRUE(tuner
                    .GetOrTune(Key(4096, 4096), 7,
                               [] { return absl::StatusOr<TuneEntry>(Entry(128, 1, 2, 2.5e-5)); })
                    .ok());
    ASSERT_TRUE(tuner.GetOrTune(Key(4096, 4096), 7, MustNotTune).ok());
    EXPECT_FALSE(
        tuner
            .GetOrTune(
                Key(8, 8), 3,
                [] { return absl::StatusOr<TuneEntry>(absl::ResourceExhaustedError("no room")); })
            .ok());
  }
  EXPECT_EQ(rec.hits, 1);
  EXPECT_EQ(rec.misses, 2);
  EXPECT_EQ(rec.entries, (std::vector<size_t>{0, 1}));  // the failed tuning changes nothing
  ASSERT_EQ(rec.tunings.size(), 2u);
  EXPECT_EQ(rec.tunings[0].key, Key(4096, 4096));
  EXPECT_EQ(rec.tunings[0].candidates, 7);
  ASSERT_TRUE(rec.tunings[0].result.ok());
  EXPECT_EQ(*rec.tunings[0].result, Entry(128, 1, 2, 2.5e-5));
  EXPECT_GE(rec.tunings[0].wall_seconds, 0.0);
  EXPECT_TRUE(rec.tunings[0].save_status.ok()) << rec.tunings[0].save_status;
  EXPECT_EQ(rec.tunings[1].result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(rec.tunings[1].candidates, 3);

  // Restarted on the same file: the entry is counted at load.
  RecordingObserver rec2;
  Autotuner restarted(File(), &rec2);
  EXPECT_EQ(rec2.entries, std::vector<size_t>{1});
}

TEST(TuneKeyTest, ForTakesEveryFieldAndToStringNamesThem) {
  const TuneKey key = TuneKey::For(TuneDevice{"NVIDIA H200", 90}, "v4_vec16",
                                   QuantShape{4096, 14336, 64, DType::kBF16}, DType::kF32,
                                   TuneObjective::kThroughput);
  EXPECT_EQ(key.device.name, "NVIDIA H200");
  EXPECT_EQ(key.device.compute_capability, 90);
  EXPECT_EQ(key.format, "awq_gemm");
  EXPECT_EQ(key.variant, "v4_vec16");
  EXPECT_EQ(key.K, 4096);
  EXPECT_EQ(key.N, 14336);
  EXPECT_EQ(key.group_size, 64);
  EXPECT_EQ(key.scale_dtype, DType::kBF16);
  EXPECT_EQ(key.output_dtype, DType::kF32);
  EXPECT_EQ(key.objective, TuneObjective::kThroughput);
  EXPECT_EQ(key.ToString(),
            "NVIDIA H200 sm90 awq_gemm v4_vec16 4096x14336 g64 bf16->fp32 throughput");
  EXPECT_NE(key, Key(4096, 14336, DType::kF32, TuneObjective::kLatency));
}

// An mxfp4 layer's key names the format and its experts (/e<E>), and the orientation when it is
// not the format's own (KN); E8M0 scales read "uint8".
TEST(TuneKeyTest, Mxfp4KeyNamesFormatExpertsAndOrientation) {
  QuantShape shape = mxfp4::MakeShape(2880, 5760, 32);
  const TuneKey kn = TuneKey::For(TuneDevice{"NVIDIA H200", 90}, "v4_vec16", shape, DType::kBF16,
                                  TuneObjective::kLatency);
  EXPECT_EQ(kn.format, "mxfp4/e32");
  EXPECT_EQ(kn.ToString(), "NVIDIA H200 sm90 mxfp4/e32 v4_vec16 2880x5760 g32 uint8->bf16 latency");
  shape.orientation = Orientation::kNK;
  shape.experts = 1;
  EXPECT_EQ(TuneKey::For(TuneDevice{"NVIDIA H200", 90}, "v4_vec16", shape, DType::kBF16,
                         TuneObjective::kLatency)
                .format,
            "mxfp4/nk");
}

TEST(TuneObjectiveTest, NamesRoundTrip) {
  for (TuneObjective o : {TuneObjective::kLatency, TuneObjective::kThroughput}) {
    TuneObjective parsed =
        o == TuneObjective::kLatency ? TuneObjective::kThroughput : TuneObjective::kLatency;
    ASSERT_TRUE(ParseTuneObjective(TuneObjectiveName(o), &parsed));
    EXPECT_EQ(parsed, o);
  }
  TuneObjective unused;
  EXPECT_FALSE(ParseTuneObjective("fastest", &unused));
  EXPECT_EQ(TuneObjectiveName(TuneObjective::kLatency), "latency");
}

TEST(LaunchConfigTest, ToStringNamesEveryField) {
  EXPECT_EQ((cuda::LaunchConfig{128, 2, 4}).ToString(), "block=128,words=2,rows=4");
}

}  // namespace
}  // namespace dequantd
