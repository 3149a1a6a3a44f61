// FilePoller: a change made after the caller's snapshot, even before the poller exists, is
// reported (the token-file and TLS reloads read their files between the two).

#include "server/auth/file_poller.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace dequantd::auth {
namespace {

std::string TempFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/file_poller_" + name;
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

// Waits up to 10 s (a bound, not an assertion on time) for `count` to reach `want`.
bool WaitFor(const std::atomic<int>& count, int want) {
  for (int i = 0; i < 1000 && count.load() < want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return count.load() >= want;
}

TEST(FilePollerTest, AChangeBeforeConstructionButAfterTheSnapshotIsReported) {
  const std::string path = TempFile("early", "reader aaaaaaaaaaaaaaaa\n");
  const std::string baseline = FilePoller::Snapshot({path});
  // Replaced between the caller's read and the poller's start (size differs: 2 bytes more).
  std::ofstream(path, std::ios::trunc) << "reader bbbbbbbbbbbbbbbbbb\n";
  std::atomic<int> changes{0};
  FilePoller poller(
      {path}, std::chrono::milliseconds(20), [&] { ++changes; }, baseline);
  EXPECT_TRUE(WaitFor(changes, 1));
  std::filesystem::remove(path);
}

TEST(FilePollerTest, NoChangeIsNoCallAndEveryLaterChangeIsOne) {
  const std::string path = TempFile("steady", "x");
  std::atomic<int> changes{0};
  {
    FilePoller poller(
        {path}, std::chrono::milliseconds(20), [&] { ++changes; }, FilePoller::Snapshot({path}));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // ten polls of an unchanged file
    EXPECT_EQ(changes.load(), 0);
    std::ofstream(path, std::ios::trunc) << "xyz";
    EXPECT_TRUE(WaitFor(changes, 1));
    std::filesystem::remove(path);  // disappearing is a change too
    EXPECT_TRUE(WaitFor(changes, 2));
  }
  EXPECT_EQ(changes.load(), 2);
}

}  // namespace
}  // namespace dequantd::auth
