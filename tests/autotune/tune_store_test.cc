// The autotuner's cache file (formats/tune_store.h): format, versions, atomic merge under flock.
#include "formats/tune_store.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "tests/autotune/cache_dir_fixture.h"
#include "tests/autotune/test_helpers.h"

namespace dequantd::formats {
namespace {

namespace fs = std::filesystem;

using autotune_testing::Entry;
using autotune_testing::Key;

// The entry for `key` in `entries`, if any.
std::optional<TuneEntry> Find(const TuneEntries& entries, const TuneKey& key) {
  for (const auto& [k, e] : entries) {
    if (k == key) return e;
  }
  return std::nullopt;
}

// A fresh directory per test (autotune_testing::CacheDirTest) and the cache file's text.
class TuneFileTest : public autotune_testing::CacheDirTest {
 protected:
  void WriteText(const std::string& text) { std::ofstream(path_) << text; }
  std::string ReadText() {
    std::ifstream f(path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
};

TEST_F(TuneFileTest, MissingFileLoadsEmptyWithoutWarning) {
  TuneFile file(path_);
  absl::StatusOr<TuneEntries> loaded = file.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->empty());
  EXPECT_EQ(file.Describe(), path_);
}

TEST_F(TuneFileTest, ParsesHandWrittenVersion4File) {
  WriteText(R"({"version": 4, "entries": [
    {"device": "NVIDIA H200", "compute_capability": 90, "format": "awq_gemm", "variant": "v4_vec16",
     "K": 4096, "N": 14336, "group_size": 128, "scale_dtype": "fp16", "output_dtype": "bf16",
     "objective": "throughput",
     "config": {"block_size": 128, "words_per_thread": 4, "rows_per_thread": 2},
     "seconds": 2.5e-05}]})");
  absl::StatusOr<TuneEntries> loaded = TuneFile(path_).Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 1u);
  EXPECT_EQ((*loaded)[0].first, Key(4096, 14336, DType::kBF16, TuneObjective::kThroughput));
  EXPECT_EQ((*loaded)[0].second.config, (cuda::LaunchConfig{128, 4, 2}));
  EXPECT_EQ((*loaded)[0].second.seconds, 2.5e-05);
}

// Version 1 (PR before issue 13: no objective, single-pass timing) is ignored cleanly: a
// warning naming the path and both versions, nothing loaded, and the next Merge replaces it.
TEST_F(TuneFileTest, Version1FileIsIgnoredWithWarningAndReplaced) {
  WriteText(R"({"version": 1, "entries": [
    {"device": "NVIDIA H200", "compute_capability": 90, "variant": "v4_vec16",
     "K": 4096, "N": 14336, "group_size": 128, "scale_dtype": "fp16", "output_dtype": "fp16",
     "config": {"block_size": 256, "words_per_thread": 1, "rows_per_thread": 2},
     "seconds": 2.5e-05}]})");
  TuneFile file(path_);
  absl::StatusOr<TuneEntries> loaded = file.Load();
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(loaded.status().message().find(path_), std::string::npos) << loaded.status();
  EXPECT_NE(loaded.status().message().find("version 1, expected 4"), std::string::npos)
      << loaded.status();

  absl::StatusOr<TuneEntries> others = file.Merge({{Key(1536, 1536), Entry(128, 1, 4, 3e-6)}});
  ASSERT_TRUE(others.ok()) << others.status();
  EXPECT_TRUE(others->empty());  // the version-1 entry is not carried over
  absl::StatusOr<TuneEntries> reloaded = file.Load();
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  ASSERT_EQ(reloaded->size(), 1u);
  EXPECT_EQ(Find(*reloaded, Key(1536, 1536)), Entry(128, 1, 4, 3e-6));
}

TEST_F(TuneFileTest, RoundTripThroughFile) {
  TuneFile file(path_);
  ASSERT_TRUE(file.Merge({{Key(1536, 8960), Entry(256, 4, 1, 1.25e-5)},
                          {Key(8192, 28672, DType::kF32), Entry(512, 2, 4, 3.5e-4)}})
                  .ok());
  absl::StatusOr<TuneEntries> reloaded = TuneFile(path_).Load();
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_EQ(reloaded->size(), 2u);
  EXPECT_EQ(Find(*reloaded, Key(1536, 8960)), Entry(256, 4, 1, 1.25e-5));
  EXPECT_EQ(Find(*reloaded, Key(8192, 28672, DType::kF32)), Entry(512, 2, 4, 3.5e-4));
  // No temporary files are left behind; the lock side file may stay.
  for (const auto& f : fs::directory_iterator(dir_)) {
    EXPECT_TRUE(f.path().filename() == "cache.json" || f.path().filename() == "cache.json.lock")
        << f.path();
  }
}

TEST_F(TuneFileTest, ObjectivesAreDistinctKeys) {
  TuneFile file(path_);
  ASSERT_TRUE(file.Merge({{Key(4096, 4096), Entry(128, 1, 2, 2e-5)},
                          {Key(4096, 4096, DType::kF16, TuneObjective::kThroughput),
                           Entry(128, 1, 16, 1.8e-5)}})
                  .ok());
  absl::StatusOr<TuneEntries> reloaded = file.Load();
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ(Find(*reloaded, Key(4096, 4096)), Entry(128, 1, 2, 2e-5));
  EXPECT_EQ(Find(*reloaded, Key(4096, 4096, DType::kF16, TuneObjective::kThroughput)),
            Entry(128, 1, 16, 1.8e-5));
}

TEST_F(TuneFileTest, MergeCreatesMissingDirectories) {
  const std::string nested = (dir_ / "a" / "b" / "cache.json").string();
  ASSERT_TRUE(TuneFile(nested).Merge({{Key(8, 8), Entry(64, 1, 1, 1e-6)}}).ok());
  absl::StatusOr<TuneEntries> reloaded = TuneFile(nested).Load();
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ(Find(*reloaded, Key(8, 8)), Entry(64, 1, 1, 1e-6));
}

TEST_F(TuneFileTest, CorruptFileWarnsLoadsNothingAndIsReplacedByMerge) {
  WriteText("{\"version\": 4, \"entries\": [{\"device\": ");  // truncated
  TuneFile file(path_);
  absl::StatusOr<TuneEntries> loaded = file.Load();
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
  EXPECT_NE(loaded.status().message().find(path_), std::string::npos) << loaded.status();

  ASSERT_TRUE(file.Merge({{Key(4096, 4096), Entry(256, 2, 2, 4e-5)}}).ok());
  absl::StatusOr<TuneEntries> reloaded = file.Load();
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_EQ(reloaded->size(), 1u);
  EXPECT_EQ(Find(*reloaded, Key(4096, 4096)), Entry(256, 2, 2, 4e-5));
}

TEST_F(TuneFileTest, MalformedEntriesAreDataLoss) {
  const char* kBad[] = {
      "[]",                                             // not an object
      R"({"entries": []})",                             // no version
      R"({"version": 4})",                              // no entries
      R"({"version": 4, "entries": {}})",               // entries not an array
      R"({"version": 4, "entries": [{"device": 3}]})",  // wrong type, missing fields
      R"({"version": 4, "entries": [{"device": "d", "compute_capability": 90, "variant": "v",
          "K": 1, "N": 8, "group_size": 1, "scale_dtype": "fp16", "output_dtype": "fp16",
          "objective": "latency",
          "config": {"block_size": 1, "words_per_thread": 1, "rows_per_thread": 1},
          "seconds": 1}]})",                            // no format (a version-2 entry)
      R"({"version": 4, "entries": [{"device": "d", "compute_capability": 90, "format": "f", "variant": "v",
          "K": 1, "N": 8, "group_size": 1, "scale_dtype": "fp8", "output_dtype": "fp16",
          "objective": "latency",
          "config": {"block_size": 1, "words_per_thread": 1, "rows_per_thread": 1},
          "seconds": 1}]})",                            // unknown dtype
      R"({"version": 4, "entries": [{"device": "d", "compute_capability": 90, "format": "f", "variant": "v",
          "K": 1, "N": 8, "group_size": 1, "scale_dtype": "fp16", "output_dtype": "fp16",
          "objective": "fastest",
          "config": {"block_size": 1, "words_per_thread": 1, "rows_per_thread": 1},
          "seconds": 1}]})",                            // unknown objective
      R"({"version": 4, "entries": [{"device": "d", "compute_capability": 90, "format": "f", "variant": "v",
          "K": 1, "N": 8, "group_size": 1, "scale_dtype": "fp16", "output_dtype": "fp16",
          "config": {"block_size": 1, "words_per_thread": 1, "rows_per_thread": 1},
          "seconds": 1}]})",                            // no objective
  };
  for (const char* text : kBad) {
    EXPECT_EQ(ParseTuneFileJson(text).status().code(), absl::StatusCode::kDataLoss) << text;
  }
}

// Version 2 (keys without the format, before issue 21), version 3 (AWQ (N, K) entries whose
// config was a block size) and any later version are ignored the same way.
TEST_F(TuneFileTest, OtherVersionIsIgnoredWithWarning) {
  for (const char* text : {R"({"version": 2, "entries": []})", R"({"version": 3, "entries": []})",
                           R"({"version": 5, "entries": []})"}) {
    WriteText(text);
    EXPECT_EQ(TuneFile(path_).Load().status().code(), absl::StatusCode::kFailedPrecondition)
        << text;
  }
}

TEST_F(TuneFileTest, UnwritableLocationIsInternal) {
  TuneFile file("/dev/null/dequantd/cache.json");  // parent is not a directory
  EXPECT_EQ(file.Merge({{Key(8, 8), Entry(64, 1, 1, 1e-6)}}).status().code(),
            absl::StatusCode::kInternal);
}

// The file is replaced by rename: a reader never sees a partial file.
TEST_F(TuneFileTest, ConcurrentReaderAlwaysSeesACompleteFile) {
  constexpr int kEntries = 1500;  // a file of about 400 KB
  TuneEntries entries;
  for (int i = 0; i < kEntries; ++i)
    entries.emplace_back(Key(128 * (i + 1), 8), Entry(256, 1, 1, i));
  TuneFile file(path_);
  ASSERT_TRUE(file.Merge(entries).ok());

  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, bad_reads{0};
  std::thread reader([&] {
    while (!stop.load()) {
      std::ifstream f(path_);
      std::stringstream ss;
      ss << f.rdbuf();
      absl::StatusOr<TuneEntries> parsed = ParseTuneFileJson(ss.str());
      if (!parsed.ok() || parsed->size() != static_cast<size_t>(kEntries)) ++bad_reads;
      ++reads;
    }
  });
  for (int round = 0; round < 5; ++round) {
    entries[0].second = Entry(256, 1, 1, round);
    ASSERT_TRUE(file.Merge(entries).ok());
  }
  // Keep writing until the reader has overlapped with the writes several times.
  while (reads.load() < 10) {
    ASSERT_TRUE(file.Merge(entries).ok());
  }
  stop = true;
  reader.join();
  EXPECT_EQ(bad_reads.load(), 0) << "of " << reads.load() << " reads";
}

TEST_F(TuneFileTest, TwoWritersOnOneFileKeepEachOthersEntries) {
  TuneFile a(path_), b(path_);
  absl::StatusOr<TuneEntries> from_a = a.Merge({{Key(1536, 1536), Entry(128, 1, 1, 1e-5)}});
  ASSERT_TRUE(from_a.ok());
  EXPECT_TRUE(from_a->empty());
  // b merges a's entry before writing, returns it, and wins for its own key.
  absl::StatusOr<TuneEntries> from_b = b.Merge(
      {{Key(4096, 4096), Entry(256, 4, 2, 2e-5)}, {Key(1536, 1536), Entry(256, 1, 1, 9e-6)}});
  ASSERT_TRUE(from_b.ok());
  EXPECT_TRUE(from_b->empty());  // b had both keys: nothing new for it
  absl::StatusOr<TuneEntries> from_a2 = a.Merge({{Key(8, 8), Entry(64, 1, 1, 1e-6)}});
  ASSERT_TRUE(from_a2.ok());
  ASSERT_EQ(from_a2->size(), 2u);  // b's two entries
  EXPECT_EQ(Find(*from_a2, Key(4096, 4096)), Entry(256, 4, 2, 2e-5));
  absl::StatusOr<TuneEntries> reloaded = TuneFile(path_).Load();
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ(reloaded->size(), 3u);
  EXPECT_EQ(Find(*reloaded, Key(1536, 1536)), Entry(256, 1, 1, 9e-6));
  EXPECT_EQ(Find(*reloaded, Key(8, 8)), Entry(64, 1, 1, 1e-6));
}

// Two processes merge disjoint keys, one Merge per new key, at the same time.
TEST_F(TuneFileTest, TwoProcessesWritingConcurrentlyLoseNothing) {
  constexpr int kPerProcess = 40;
  pid_t children[2];
  for (int p = 0; p < 2; ++p) {
    children[p] = ::fork();
    ASSERT_GE(children[p], 0);
    if (children[p] == 0) {
      TuneFile file(path_);
      TuneEntries mine;
      int failures = 0;
      for (int i = 0; i < kPerProcess; ++i) {
        mine.emplace_back(Key(128 * (i + 1), 8 * (p + 1)), Entry(256, 1, 1, i));
        if (!file.Merge(mine).ok()) ++failures;
      }
      ::_exit(failures == 0 ? 0 : 1);
    }
  }
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  absl::StatusOr<TuneEntries> reloaded = TuneFile(path_).Load();
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ(reloaded->size(), 2u * kPerProcess);
  for (int p = 0; p < 2; ++p) {
    for (int i = 0; i < kPerProcess; ++i) {
      EXPECT_EQ(Find(*reloaded, Key(128 * (i + 1), 8 * (p + 1))), Entry(256, 1, 1, i));
    }
  }
}

TEST(TuneFileJsonTest, SerializationIsSortedAndStable) {
  TuneEntries entries = {{Key(4096, 4096), Entry(256, 1, 1, 1)},
                         {Key(1536, 1536), Entry(128, 1, 1, 2)}};
  TuneEntries reversed = {entries[1], entries[0]};
  const std::string text = TuneFileToJson(entries);
  EXPECT_EQ(text, TuneFileToJson(reversed));
  EXPECT_NE(text.find("\"objective\": \"latency\""), std::string::npos) << text;
  absl::StatusOr<TuneEntries> parsed = ParseTuneFileJson(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[0].first, Key(1536, 1536));
  EXPECT_EQ((*parsed)[1].first, Key(4096, 4096));
  EXPECT_EQ((*parsed)[1].second, Entry(256, 1, 1, 1));
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

TEST(ResolveTuneFilePathTest, FlagWinsOverEnvironment) {
  ScopedEnv xdg("XDG_CACHE_HOME", "/tmp/xdg");
  EXPECT_EQ(ResolveTuneFilePath("/data/tc.json"), "/data/tc.json");
}

TEST(ResolveTuneFilePathTest, XdgCacheHomeThenHome) {
  ScopedEnv home("HOME", "/home/alice");
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/var/cache/alice");
    EXPECT_EQ(ResolveTuneFilePath(""), "/var/cache/alice/dequantd/tune_cache.json");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "");  // empty counts as unset (XDG Base Directory spec)
    EXPECT_EQ(ResolveTuneFilePath(""), "/home/alice/.cache/dequantd/tune_cache.json");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    EXPECT_EQ(ResolveTuneFilePath(""), "/home/alice/.cache/dequantd/tune_cache.json");
    ScopedEnv no_home("HOME", nullptr);
    EXPECT_EQ(ResolveTuneFilePath(""), "");  // memory only
  }
}

TEST_F(TuneFileTest, CreateDirectoryMakesNestedParents) {
  const std::string path = (dir_ / "a" / "b" / "dequantd" / "tune_cache.json").string();
  ASSERT_TRUE(CreateTuneFileDirectory(path).ok());
  EXPECT_TRUE(fs::is_directory(dir_ / "a" / "b" / "dequantd"));
  EXPECT_FALSE(fs::exists(path));                        // the file itself is written by Merge
  EXPECT_TRUE(CreateTuneFileDirectory(path).ok());       // already there
  EXPECT_TRUE(CreateTuneFileDirectory("").ok());         // memory only
  EXPECT_TRUE(CreateTuneFileDirectory("tc.json").ok());  // current directory
}

TEST_F(TuneFileTest, CreateDirectoryUnderAFileIsInternalNamingIt) {
  WriteText("x");  // path_ is now a file
  const absl::Status s = CreateTuneFileDirectory(path_ + "/sub/tune_cache.json");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find(path_ + "/sub"), std::string::npos) << s;
}

}  // namespace
}  // namespace dequantd::formats
