#include "kernels/tune_cache.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "tests/autotune/cache_dir_fixture.h"
#include "tests/autotune/test_helpers.h"

namespace dequantd {
namespace {

namespace fs = std::filesystem;

using autotune_testing::Entry;
using autotune_testing::Key;

// A fresh directory per test (autotune_testing::CacheDirTest) and the cache file's text.
class TuneCacheTest : public autotune_testing::CacheDirTest {
 protected:
  void WriteText(const std::string& text) { std::ofstream(path_) << text; }
  std::string ReadText() {
    std::ifstream f(path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
};

TEST_F(TuneCacheTest, MissingFileLoadsEmptyWithoutWarning) {
  TuneCache cache(path_);
  EXPECT_TRUE(cache.Load().ok());
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_FALSE(cache.Lookup(Key(4096, 4096)).has_value());
}

TEST_F(TuneCacheTest, ParsesHandWrittenVersion1File) {
  WriteText(R"({"version": 1, "entries": [
    {"device": "NVIDIA H200", "compute_capability": 90, "variant": "v4_vec16",
     "K": 4096, "N": 14336, "group_size": 128, "scale_dtype": "fp16", "output_dtype": "bf16",
     "config": {"block_size": 128, "words_per_thread": 4, "rows_per_thread": 2},
     "seconds": 2.5e-05}]})");
  TuneCache cache(path_);
  ASSERT_TRUE(cache.Load().ok());
  ASSERT_EQ(cache.size(), 1u);
  const std::optional<TuneEntry> e = cache.Lookup(Key(4096, 14336, DType::kBF16));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->config, (TunedConfig{128, 4, 2}));
  EXPECT_EQ(e->seconds, 2.5e-05);
  EXPECT_FALSE(cache.Lookup(Key(4096, 14336, DType::kF16)).has_value());
}

TEST_F(TuneCacheTest, RoundTripThroughFile) {
  {
    TuneCache cache(path_);
    cache.Insert(Key(1536, 8960), Entry(256, 4, 1, 1.25e-5));
    cache.Insert(Key(8192, 28672, DType::kF32), Entry(512, 2, 4, 3.5e-4));
    ASSERT_TRUE(cache.Save().ok());
  }
  TuneCache reloaded(path_);
  ASSERT_TRUE(reloaded.Load().ok());
  EXPECT_EQ(reloaded.size(), 2u);
  EXPECT_EQ(reloaded.Lookup(Key(1536, 8960)), Entry(256, 4, 1, 1.25e-5));
  EXPECT_EQ(reloaded.Lookup(Key(8192, 28672, DType::kF32)), Entry(512, 2, 4, 3.5e-4));
  // No temporary files are left behind; the lock side file may stay.
  for (const auto& f : fs::directory_iterator(dir_)) {
    EXPECT_TRUE(f.path().filename() == "cache.json" || f.path().filename() == "cache.json.lock")
        << f.path();
  }
}

TEST_F(TuneCacheTest, SaveCreatesMissingDirectories) {
  const std::string nested = (dir_ / "a" / "b" / "cache.json").string();
  TuneCache cache(nested);
  cache.Insert(Key(8, 8), Entry(64, 1, 1, 1e-6));
  ASSERT_TRUE(cache.Save().ok());
  TuneCache reloaded(nested);
  ASSERT_TRUE(reloaded.Load().ok());
  EXPECT_EQ(reloaded.Lookup(Key(8, 8)), Entry(64, 1, 1, 1e-6));
}

TEST_F(TuneCacheTest, CorruptFileWarnsLoadsNothingAndIsReplacedBySave) {
  WriteText("{\"version\": 1, \"entries\": [{\"device\": ");  // truncated
  TuneCache cache(path_);
  const absl::Status warning = cache.Load();
  EXPECT_EQ(warning.code(), absl::StatusCode::kDataLoss) << warning;
  EXPECT_NE(warning.message().find(path_), std::string::npos) << warning;
  EXPECT_EQ(cache.size(), 0u);

  cache.Insert(Key(4096, 4096), Entry(256, 2, 2, 4e-5));
  ASSERT_TRUE(cache.Save().ok());
  TuneCache reloaded(path_);
  ASSERT_TRUE(reloaded.Load().ok());
  EXPECT_EQ(reloaded.size(), 1u);
  EXPECT_EQ(reloaded.Lookup(Key(4096, 4096)), Entry(256, 2, 2, 4e-5));
}

TEST_F(TuneCacheTest, MalformedEntriesAreDataLoss) {
  const char* kBad[] = {
      "[]",                                             // not an object
      R"({"entries": []})",                             // no version
      R"({"version": 1})",                              // no entries
      R"({"version": 1, "entries": {}})",               // entries not an array
      R"({"version": 1, "entries": [{"device": 3}]})",  // wrong type, missing fields
      R"({"version": 1, "entries": [{"device": "d", "compute_capability": 90, "variant": "v",
          "K": 1, "N": 8, "group_size": 1, "scale_dtype": "fp8", "output_dtype": "fp16",
          "config": {"block_size": 1, "words_per_thread": 1, "rows_per_thread": 1},
          "seconds": 1}]})",                            // unknown dtype
  };
  for (const char* text : kBad) {
    EXPECT_EQ(ParseTuneCacheJson(text).status().code(), absl::StatusCode::kDataLoss) << text;
  }
}

TEST_F(TuneCacheTest, OtherVersionIsIgnoredWithWarning) {
  WriteText(R"({"version": 2, "entries": []})");
  TuneCache cache(path_);
  const absl::Status warning = cache.Load();
  EXPECT_EQ(warning.code(), absl::StatusCode::kFailedPrecondition) << warning;
  EXPECT_EQ(cache.size(), 0u);
}

TEST_F(TuneCacheTest, UnwritableLocationIsInternalAndKeepsMemory) {
  TuneCache cache("/dev/null/dequantd/cache.json");  // parent is not a directory
  cache.Insert(Key(8, 8), Entry(64, 1, 1, 1e-6));
  EXPECT_EQ(cache.Save().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(cache.Lookup(Key(8, 8)), Entry(64, 1, 1, 1e-6));
}

TEST_F(TuneCacheTest, MemoryOnlyCacheNeverTouchesDisk) {
  TuneCache cache("");
  cache.Insert(Key(8, 8), Entry(64, 1, 1, 1e-6));
  EXPECT_TRUE(cache.Load().ok());
  EXPECT_TRUE(cache.Save().ok());
  EXPECT_EQ(cache.size(), 1u);
}

// The file is replaced by rename: a reader never sees a partial file.
TEST_F(TuneCacheTest, ConcurrentReaderAlwaysSeesACompleteFile) {
  constexpr int kEntries = 1500;  // a file of about 400 KB
  TuneCache cache(path_);
  for (int i = 0; i < kEntries; ++i) cache.Insert(Key(128 * (i + 1), 8), Entry(256, 1, 1, i));
  ASSERT_TRUE(cache.Save().ok());

  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, bad_reads{0};
  std::thread reader([&] {
    while (!stop.load()) {
      std::ifstream f(path_);
      std::stringstream ss;
      ss << f.rdbuf();
      absl::StatusOr<std::vector<std::pair<TuneKey, TuneEntry>>> parsed =
          ParseTuneCacheJson(ss.str());
      if (!parsed.ok() || parsed->size() != static_cast<size_t>(kEntries)) ++bad_reads;
      ++reads;
    }
  });
  for (int round = 0; round < 5; ++round) {
    cache.Insert(Key(128, 8), Entry(256, 1, 1, round));
    ASSERT_TRUE(cache.Save().ok());
  }
  // Keep writing until the reader has overlapped with the writes several times.
  while (reads.load() < 10) {
    ASSERT_TRUE(cache.Save().ok());
  }
  stop = true;
  reader.join();
  EXPECT_EQ(bad_reads.load(), 0) << "of " << reads.load() << " reads";
}

TEST_F(TuneCacheTest, TwoInstancesOnOneFileKeepEachOthersEntries) {
  TuneCache a(path_), b(path_);
  ASSERT_TRUE(a.Load().ok());
  ASSERT_TRUE(b.Load().ok());
  a.Insert(Key(1536, 1536), Entry(128, 1, 1, 1e-5));
  b.Insert(Key(4096, 4096), Entry(256, 4, 2, 2e-5));
  ASSERT_TRUE(a.Save().ok());
  ASSERT_TRUE(b.Save().ok());  // merges a's entry before writing
  TuneCache reloaded(path_);
  ASSERT_TRUE(reloaded.Load().ok());
  EXPECT_EQ(reloaded.size(), 2u);
  EXPECT_EQ(reloaded.Lookup(Key(1536, 1536)), Entry(128, 1, 1, 1e-5));
  EXPECT_EQ(reloaded.Lookup(Key(4096, 4096)), Entry(256, 4, 2, 2e-5));
  // b also picked up a's entry in memory.
  EXPECT_EQ(b.Lookup(Key(1536, 1536)), Entry(128, 1, 1, 1e-5));
}

// Two processes insert disjoint keys, saving after each insert, at the same time.
TEST_F(TuneCacheTest, TwoProcessesWritingConcurrentlyLoseNothing) {
  constexpr int kPerProcess = 40;
  pid_t children[2];
  for (int p = 0; p < 2; ++p) {
    children[p] = ::fork();
    ASSERT_GE(children[p], 0);
    if (children[p] == 0) {
      TuneCache cache(path_);
      int failures = 0;
      for (int i = 0; i < kPerProcess; ++i) {
        cache.Insert(Key(128 * (i + 1), 8 * (p + 1)), Entry(256, 1, 1, i));
        if (!cache.Save().ok()) ++failures;
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
  TuneCache reloaded(path_);
  ASSERT_TRUE(reloaded.Load().ok());
  EXPECT_EQ(reloaded.size(), 2u * kPerProcess);
  for (int p = 0; p < 2; ++p) {
    for (int i = 0; i < kPerProcess; ++i) {
      EXPECT_EQ(reloaded.Lookup(Key(128 * (i + 1), 8 * (p + 1))), Entry(256, 1, 1, i));
    }
  }
}

TEST(TuneCacheJsonTest, SerializationIsSortedAndStable) {
  std::vector<std::pair<TuneKey, TuneEntry>> entries = {{Key(4096, 4096), Entry(256, 1, 1, 1)},
                                                        {Key(1536, 1536), Entry(128, 1, 1, 2)}};
  std::vector<std::pair<TuneKey, TuneEntry>> reversed = {entries[1], entries[0]};
  const std::string text = TuneCacheToJson(entries);
  EXPECT_EQ(text, TuneCacheToJson(reversed));
  absl::StatusOr<std::vector<std::pair<TuneKey, TuneEntry>>> parsed = ParseTuneCacheJson(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[0].first, Key(1536, 1536));
  EXPECT_EQ((*parsed)[1].first, Key(4096, 4096));
  EXPECT_EQ((*parsed)[1].second, Entry(256, 1, 1, 1));
}

TEST(TuneKeyTest, ToStringNamesEveryField) {
  EXPECT_EQ(Key(4096, 14336, DType::kBF16).ToString(),
            "NVIDIA H200 sm90 v4_vec16 4096x14336 g128 fp16->bf16");
}

TEST(DefaultTuneCachePathTest, PrefersXdgCacheHome) {
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old_xdg ? old_xdg : "";
  ::setenv("XDG_CACHE_HOME", "/var/cache/x", 1);
  EXPECT_EQ(DefaultTuneCachePath(), "/var/cache/x/dequantd/tune_cache.json");
  ::unsetenv("XDG_CACHE_HOME");
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    EXPECT_EQ(DefaultTuneCachePath(), std::string(home) + "/.cache/dequantd/tune_cache.json");
  }
  if (old_xdg) ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

}  // namespace
}  // namespace dequantd
