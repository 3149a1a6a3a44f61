// ServerAutotuner and its helpers without a GPU: the key built for a launch, the cache path
// resolution and directory, distinct layer shapes, hit/miss accounting with a fake tuning, the
// cache surviving a "restart" (a second tuner on the same file), and Pretune over a fake target.
#include "server/server_autotuner.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh directory for one test.
std::string FreshDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("server_autotuner_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Sets an environment variable for the scope, restoring the old value (or its absence) after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_.has_value()) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

const TuneDevice kH200{"NVIDIA H200", 90};

TEST(MakeServerTuneKeyTest, EveryFieldFromDeviceVariantShapeAndDtype) {
  const TuneKey key =
      MakeServerTuneKey(kH200, "v4_vec16", AwqShape{4096, 14336, 128, DType::kBF16}, DType::kF32);
  EXPECT_EQ(key.device, "NVIDIA H200");
  EXPECT_EQ(key.compute_capability, 90);
  EXPECT_EQ(key.variant, "v4_vec16");
  EXPECT_EQ(key.K, 4096);
  EXPECT_EQ(key.N, 14336);
  EXPECT_EQ(key.group_size, 128);
  EXPECT_EQ(key.scale_dtype, DType::kBF16);
  EXPECT_EQ(key.output_dtype, DType::kF32);
  EXPECT_EQ(key.ToString(), "NVIDIA H200 sm90 v4_vec16 4096x14336 g128 bf16->fp32");
}

TEST(TunedConfigToStringTest, SameFormatAsLaunchConfig) {
  EXPECT_EQ(TunedConfigToString(TunedConfig{128, 2, 4}), "block=128,words=2,rows=4");
}

TEST(ResolveTuneCachePathTest, FlagWinsOverEnvironment) {
  ScopedEnv xdg("XDG_CACHE_HOME", "/tmp/xdg");
  EXPECT_EQ(ResolveTuneCachePath("/data/tc.json"), "/data/tc.json");
}

TEST(ResolveTuneCachePathTest, XdgCacheHomeThenHome) {
  ScopedEnv home("HOME", "/home/alice");
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/var/cache/alice");
    EXPECT_EQ(ResolveTuneCachePath(""), "/var/cache/alice/dequantd/tune_cache.json");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "");  // empty counts as unset (XDG Base Directory spec)
    EXPECT_EQ(ResolveTuneCachePath(""), "/home/alice/.cache/dequantd/tune_cache.json");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    EXPECT_EQ(ResolveTuneCachePath(""), "/home/alice/.cache/dequantd/tune_cache.json");
    ScopedEnv no_home("HOME", nullptr);
    EXPECT_EQ(ResolveTuneCachePath(""), "");  // memory only
  }
}

TEST(CreateTuneCacheDirectoryTest, CreatesNestedParents) {
  const std::string dir = FreshDir("mkdir");
  const std::string path = dir + "/a/b/dequantd/tune_cache.json";
  ASSERT_TRUE(CreateTuneCacheDirectory(path).ok());
  EXPECT_TRUE(fs::is_directory(dir + "/a/b/dequantd"));
  EXPECT_FALSE(fs::exists(path));                         // the file itself is written by Save
  EXPECT_TRUE(CreateTuneCacheDirectory(path).ok());       // already there
  EXPECT_TRUE(CreateTuneCacheDirectory("").ok());         // memory only
  EXPECT_TRUE(CreateTuneCacheDirectory("tc.json").ok());  // current directory
}

TEST(CreateTuneCacheDirectoryTest, ParentIsAFileIsInternalNamingIt) {
  const std::string dir = FreshDir("mkdir_file");
  std::ofstream(dir + "/blocker") << "x";
  const absl::Status s = CreateTuneCacheDirectory(dir + "/blocker/sub/tune_cache.json");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr(dir + "/blocker/sub"));
}

QuantizedLayer Layer(const std::string& name, int64_t K, int64_t N, int64_t G, DType scales) {
  QuantizedLayer layer;
  layer.name = name;
  layer.view.shape = AwqShape{K, N, G, scales};
  return layer;
}

TEST(DistinctLayerShapesTest, OnePerKNGroupAndScaleDtypeInFirstAppearanceOrder) {
  const std::vector<QuantizedLayer> layers = {
      Layer("l0.q_proj", 1536, 1536, 128, DType::kF16),
      Layer("l0.up_proj", 1536, 8960, 128, DType::kF16),
      Layer("l1.q_proj", 1536, 1536, 128, DType::kF16),   // same as l0.q_proj
      Layer("l1.k_proj", 1536, 1536, 64, DType::kF16),    // other group size
      Layer("l1.v_proj", 1536, 1536, 128, DType::kBF16),  // other scale dtype
      Layer("l1.up_proj", 1536, 8960, 128, DType::kF16),  // same as l0.up_proj
      Layer("l1.down_proj", 8960, 1536, 128, DType::kF16),
  };
  const std::vector<AwqShape> shapes = DistinctLayerShapes(layers);
  ASSERT_EQ(shapes.size(), 5u);
  auto expect = [&](size_t i, int64_t K, int64_t N, int64_t G, DType s) {
    SCOPED_TRACE(i);
    EXPECT_EQ(shapes[i].K, K);
    EXPECT_EQ(shapes[i].N, N);
    EXPECT_EQ(shapes[i].group_size, G);
    EXPECT_EQ(shapes[i].scale_dtype, s);
  };
  expect(0, 1536, 1536, 128, DType::kF16);
  expect(1, 1536, 8960, 128, DType::kF16);
  expect(2, 1536, 1536, 64, DType::kF16);
  expect(3, 1536, 1536, 128, DType::kBF16);
  expect(4, 8960, 1536, 128, DType::kF16);
  EXPECT_TRUE(DistinctLayerShapes({}).empty());
}

// Records the observer calls.
struct Recorded {
  std::mutex mu;
  int hits = 0, misses = 0;
  std::vector<AutotuneTuning> tunings;

  AutotuneObservers Observers() {
    AutotuneObservers o;
    o.on_lookup = [this](bool hit) {
      std::lock_guard lock(mu);
      ++(hit ? hits : misses);
    };
    o.on_tuning = [this](const AutotuneTuning& t) {
      std::lock_guard lock(mu);
      tunings.push_back(t);
    };
    return o;
  }
};

const TuneKey kKey = MakeServerTuneKey(kH200, "v4_vec16", AwqShape{4096, 4096, 128}, DType::kF16);
const TuneEntry kWinner{TunedConfig{128, 1, 2}, 2.5e-5};

TEST(ServerAutotunerTest, FirstRequestTunesOnceThenHitsAndTheFileSurvivesARestart) {
  const std::string path = FreshDir("restart") + "/dequantd/tune_cache.json";
  ASSERT_TRUE(CreateTuneCacheDirectory(path).ok());
  {
    Recorded rec;
    ServerAutotuner tuner(path, rec.Observers());
    EXPECT_TRUE(tuner.load_warning().ok());  // no file yet is not a warning
    EXPECT_EQ(tuner.cache_path(), path);
    EXPECT_FALSE(tuner.Lookup(kKey).has_value());
    int runs = 0;
    absl::StatusOr<TunedConfig> tuned = tuner.Tune(kKey, 7, [&]() -> absl::StatusOr<TuneEntry> {
      ++runs;
      return kWinner;
    });
    ASSERT_TRUE(tuned.ok()) << tuned.status();
    EXPECT_EQ(*tuned, kWinner.config);
    EXPECT_EQ(runs, 1);
    std::optional<TunedConfig> hit = tuner.Lookup(kKey);
    ASSERT_TRUE(hit.has_value());
    EXPECT_EQ(*hit, kWinner.config);

    const ServerAutotuneCounters c = tuner.counters();
    EXPECT_EQ(c.hits, 1u);
    EXPECT_EQ(c.misses, 1u);
    EXPECT_EQ(c.tunings, 1u);
    EXPECT_EQ(c.tune_failures, 0u);
    EXPECT_EQ(c.entries, 1u);
    EXPECT_EQ(rec.hits, 1);
    EXPECT_EQ(rec.misses, 1);
    ASSERT_EQ(rec.tunings.size(), 1u);
    EXPECT_EQ(rec.tunings[0].key, kKey);
    EXPECT_EQ(rec.tunings[0].candidates, 7);
    ASSERT_TRUE(rec.tunings[0].result.ok());
    EXPECT_EQ(*rec.tunings[0].result, kWinner);
    EXPECT_GE(rec.tunings[0].wall_seconds, 0.0);
    EXPECT_TRUE(rec.tunings[0].save_status.ok()) << rec.tunings[0].save_status;
  }
  ASSERT_TRUE(fs::exists(path));
  // The restarted server: the entry comes from the file, nothing is tuned.
  Recorded rec;
  ServerAutotuner restarted(path, rec.Observers());
  EXPECT_TRUE(restarted.load_warning().ok()) << restarted.load_warning();
  EXPECT_EQ(restarted.counters().entries, 1u);
  std::optional<TunedConfig> hit = restarted.Lookup(kKey);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, kWinner.config);
  EXPECT_EQ(restarted.counters().hits, 1u);
  EXPECT_EQ(restarted.counters().misses, 0u);
  EXPECT_EQ(restarted.counters().tunings, 0u);
  EXPECT_TRUE(rec.tunings.empty());
}

TEST(ServerAutotunerTest, FailedTuningIsReturnedObservedAndNotStored) {
  Recorded rec;
  ServerAutotuner tuner("", rec.Observers());  // memory only
  absl::StatusOr<TunedConfig> tuned = tuner.Tune(kKey, 3, []() -> absl::StatusOr<TuneEntry> {
    return absl::ResourceExhaustedError("no scratch memory");
  });
  EXPECT_EQ(tuned.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(tuner.Lookup(kKey).has_value());
  const ServerAutotuneCounters c = tuner.counters();
  EXPECT_EQ(c.misses, 1u);
  EXPECT_EQ(c.tunings, 1u);
  EXPECT_EQ(c.tune_failures, 1u);
  EXPECT_EQ(c.entries, 0u);
  ASSERT_EQ(rec.tunings.size(), 1u);
  EXPECT_EQ(rec.tunings[0].result.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(ServerAutotunerTest, ConcurrentMissesForOneKeyTuneOnce) {
  Recorded rec;
  ServerAutotuner tuner("", rec.Observers());
  std::atomic<int> runs{0};
  constexpr int kThreads = 8;
  std::vector<absl::StatusOr<TunedConfig>> results(kThreads, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      results[i] = tuner.Tune(kKey, 2, [&]() -> absl::StatusOr<TuneEntry> {
        ++runs;
        return kWinner;
      });
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(runs.load(), 1);
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, kWinner.config);
  }
  EXPECT_EQ(tuner.counters().misses, static_cast<uint64_t>(kThreads));
  EXPECT_EQ(tuner.counters().tunings, 1u);
  EXPECT_EQ(rec.tunings.size(), 1u);
}

TEST(ServerAutotunerTest, CorruptAndOtherVersionFilesAreWarnedAndIgnored) {
  const std::string dir = FreshDir("bad_files");
  std::ofstream(dir + "/corrupt.json") << "{\"version\": 1, \"entries\": [";
  std::ofstream(dir + "/v999.json") << "{\"version\": 999, \"entries\": []}";
  ServerAutotuner corrupt(dir + "/corrupt.json", {});
  EXPECT_EQ(corrupt.load_warning().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(corrupt.counters().entries, 0u);
  ServerAutotuner other(dir + "/v999.json", {});
  EXPECT_EQ(other.load_warning().code(), absl::StatusCode::kFailedPrecondition);
  // Still usable: a tuning replaces the bad file with a valid one.
  ASSERT_TRUE(other.Tune(kKey, 2, [] { return absl::StatusOr<TuneEntry>(kWinner); }).ok());
  ServerAutotuner reread(dir + "/v999.json", {});
  EXPECT_TRUE(reread.load_warning().ok()) << reread.load_warning();
  EXPECT_EQ(reread.counters().entries, 1u);
}

// A target whose candidate counts and failures are scripted per K.
class FakeTarget final : public TuneTarget {
 public:
  TuneKey Key(const AwqShape& shape, DType out_dtype) const override {
    return MakeServerTuneKey(kH200, "v4_vec16", shape, out_dtype);
  }
  int CandidateCount(const AwqShape& shape, DType) const override {
    return shape.K == 128 ? 1 : 5;  // K = 128: a single candidate, nothing to tune
  }
  absl::StatusOr<TuneEntry> TuneScratch(const AwqShape& shape, DType out_dtype) override {
    tuned.push_back(Key(shape, out_dtype));
    if (shape.K == 512) return absl::InternalError("scripted failure");
    return TuneEntry{TunedConfig{static_cast<int>(shape.N / 8), 1, 1}, 1e-5};
  }
  std::vector<TuneKey> tuned;  // TuneScratch calls, in order
};

TEST(PretuneTest, TunesOnlyWhatIsTunableAndNotCached) {
  Recorded rec;
  ServerAutotuner tuner("", rec.Observers());
  FakeTarget target;
  const AwqShape cached{256, 512, 128};
  ASSERT_TRUE(tuner
                  .Tune(target.Key(cached, DType::kF16), 5,
                        [] { return absl::StatusOr<TuneEntry>(kWinner); })
                  .ok());
  const std::vector<AwqShape> shapes = {
      AwqShape{128, 256, 128},  // untunable
      cached,                   // already cached
      AwqShape{512, 256, 128},  // fails
      AwqShape{1024, 2048, 128},
      AwqShape{2048, 1024, 128, DType::kBF16},
  };
  const DType dtypes[] = {DType::kF16};
  const PretuneReport report = Pretune(tuner, target, shapes, dtypes);
  EXPECT_EQ(report.keys, 5);
  EXPECT_EQ(report.untunable, 1);
  EXPECT_EQ(report.cached, 1);
  EXPECT_EQ(report.failed, 1);
  EXPECT_EQ(report.tuned, 2);
  EXPECT_EQ(report.first_error.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(report.first_error.message(), HasSubstr("512x256"));
  ASSERT_EQ(target.tuned.size(), 3u);  // not the untunable nor the cached shape
  EXPECT_EQ(target.tuned[0].K, 512);
  EXPECT_EQ(target.tuned[1].K, 1024);
  EXPECT_EQ(target.tuned[2].K, 2048);
  EXPECT_EQ(target.tuned[2].scale_dtype, DType::kBF16);
  std::optional<TunedConfig> hit = tuner.Lookup(target.Key(shapes[3], DType::kF16));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->block_size, 2048 / 8);
  // A second pretune finds everything tunable cached except the failed shape, tuned again.
  target.tuned.clear();
  const PretuneReport again = Pretune(tuner, target, shapes, dtypes);
  EXPECT_EQ(again.cached, 3);
  EXPECT_EQ(again.failed, 1);
  EXPECT_EQ(again.tuned, 0);
  ASSERT_EQ(target.tuned.size(), 1u);
  EXPECT_EQ(target.tuned[0].K, 512);
}

}  // namespace
}  // namespace dequantd
