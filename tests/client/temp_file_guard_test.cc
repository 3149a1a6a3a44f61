// SIGINT/SIGTERM/SIGHUP/SIGPIPE while dequantctl writes an output file: the temporary file is
// removed and the process still dies of the signal. Each case runs in a forked child that installs
// the handler.
#include "client/temp_file_guard.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/output_file.h"
#include "gtest/gtest.h"
#include "tests/client/test_dir.h"

namespace dequantd {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::dequant::v1;

// The names of the entries of `dir` that look like temporary files ("*.tmp.*").
std::vector<std::string> TemporaryFiles(const std::string& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (absl::StrContains(name, ".tmp.")) names.push_back(name);
  }
  return names;
}

// Runs `body` in a forked child (which first installs the handlers) and returns its wait status.
// Child exit codes 10.. mean a check inside the child failed; 0 means it survived. The child
// starts with the default action for each signal (this test may have inherited SIG_IGN), except
// `ignored_signal` (if not 0), which it ignores before installing the handlers.
int RunInChild(const std::function<int()>& body, int ignored_signal = 0) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) std::signal(sig, SIG_DFL);
    if (ignored_signal != 0) std::signal(ignored_signal, SIG_IGN);
    InstallTempFileSignalHandlers();
    ::_exit(body());
  }
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return status;
}

v1::DequantizeHeader Header16x8Fp16() {
  v1::DequantizeHeader h;
  h.add_shape(16);
  h.add_shape(8);
  h.set_dtype(v1::DTYPE_FP16);
  h.set_total_bytes(16 * 8 * 2);
  return h;
}

// Opens an OutputFile in a fresh directory, writes half of the result, checks that the temporary
// file exists, then raises `sig`.
void ExpectSignalRemovesTemporaryFile(const std::string& name, int sig) {
  const std::string dir = client_test::TempPath(name + "_" + std::to_string(sig) + "_dir");
  fs::create_directories(dir);
  const std::string path = dir + "/" + name;
  const int status = RunInChild([&] {
    std::unique_ptr<OutputFile> file = OutputFile::ForPath(path, "t");
    if (!file->Begin(Header16x8Fp16()).ok()) return 10;
    const std::vector<uint8_t> half(16 * 8, 0x3c);
    if (!file->Write(half).ok()) return 11;
    if (TemporaryFiles(dir).size() != 1) return 12;  // the file being written
    std::raise(sig);
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exit status " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), sig);
  EXPECT_TRUE(TemporaryFiles(dir).empty()) << TemporaryFiles(dir).front();
  EXPECT_FALSE(fs::exists(path));
}

TEST(TempFileGuardTest, SigtermRemovesTheTemporaryNpyFile) {
  ExpectSignalRemovesTemporaryFile("out.npy", SIGTERM);
}

TEST(TempFileGuardTest, SigintRemovesTheTemporaryNpyFile) {
  ExpectSignalRemovesTemporaryFile("out.npy", SIGINT);
}

TEST(TempFileGuardTest, SigtermRemovesTheTemporaryRawFile) {
  ExpectSignalRemovesTemporaryFile("out.bin", SIGTERM);
}

TEST(TempFileGuardTest, SighupRemovesTheTemporaryNpyFile) {
  ExpectSignalRemovesTemporaryFile("out.npy", SIGHUP);
}

TEST(TempFileGuardTest, SigpipeRemovesTheTemporaryRawFile) {
  ExpectSignalRemovesTemporaryFile("out.bin", SIGPIPE);
}

// Under nohup SIGHUP is ignored: installing the handlers keeps it ignored, so the process survives
// and the registered file stays.
TEST(TempFileGuardTest, InheritedIgnoredSighupStaysIgnored) {
  const std::string registered = client_test::TempPath("ignored_sighup_registered");
  std::ofstream(registered) << "x";
  const int status = RunInChild(
      [&] {
        TempFileGuard guard(registered);
        std::raise(SIGHUP);
        return fs::exists(registered) ? 0 : 10;
      },
      SIGHUP);
  ASSERT_TRUE(WIFEXITED(status)) << "child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(fs::exists(registered));
}

TEST(TempFileGuardTest, FinishedFileStaysAndIsNoLongerRegistered) {
  const std::string dir = client_test::TempPath("finished_dir");
  fs::create_directories(dir);
  const std::string path = dir + "/out.bin";
  const int status = RunInChild([&] {
    std::unique_ptr<OutputFile> file = OutputFile::ForPath(path, "t");
    if (!file->Begin(Header16x8Fp16()).ok()) return 10;
    if (!file->Write(std::vector<uint8_t>(16 * 8 * 2, 7)).ok()) return 11;
    if (!file->Finish().ok()) return 12;
    std::raise(SIGTERM);
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exit status " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_EQ(fs::file_size(path), 16u * 8 * 2);
  EXPECT_TRUE(TemporaryFiles(dir).empty());
}

TEST(TempFileGuardTest, OnlyPathsOfLiveGuardsAreRemoved) {
  const std::string kept = client_test::TempPath("guard_kept");
  const std::string removed = client_test::TempPath("guard_removed");
  std::ofstream(kept) << "kept";
  std::ofstream(removed) << "removed";
  const int status = RunInChild([&] {
    { TempFileGuard released(kept); }
    TempFileGuard live(removed);
    TempFileGuard moved_to(std::move(live));
    if (!moved_to.registered()) return 10;
    std::raise(SIGTERM);
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exit status " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_TRUE(fs::exists(kept));
  EXPECT_FALSE(fs::exists(removed));
}

TEST(TempFileGuardTest, DeferralHoldsTheSignalUntilItEnds) {
  const std::string registered = client_test::TempPath("deferred_registered");
  const std::string marker = client_test::TempPath("deferred_marker");
  std::ofstream(registered) << "x";
  const int status = RunInChild([&] {
    TempFileGuard guard(registered);
    {
      ScopedSignalDeferral outer;
      {
        ScopedSignalDeferral inner;
        std::raise(SIGTERM);
      }
      std::ofstream(marker) << "still running";  // the inner deferral ending did not re-raise
      if (!fs::exists(registered)) return 10;
    }
    return 0;  // not reached: the outer deferral re-raises
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exit status " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_TRUE(fs::exists(marker));
  EXPECT_FALSE(fs::exists(registered));
}

TEST(TempFileGuardTest, OverlongPathIsNotRegistered) {
  EXPECT_FALSE(TempFileGuard(std::string(kMaxTempPathBytes, 'a')).registered());
  EXPECT_TRUE(TempFileGuard(std::string(kMaxTempPathBytes - 1, 'a')).registered());
}

}  // namespace
}  // namespace dequantd
