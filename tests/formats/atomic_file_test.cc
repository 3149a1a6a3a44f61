// AtomicFileWriter: the file appears only on Commit, with exactly the bytes written; abandoned or
// destroyed writers leave nothing behind; errors carry errno-derived codes. A symlink is kept and
// its target replaced; a FIFO or device is written in place and stays what it is.
#include "formats/atomic_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace dequantd::formats {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A fresh directory per test, removed afterwards.
class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "/atomic_file_test.XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  // The number of entries in the directory (the temporary file included).
  int Entries() const {
    return static_cast<int>(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()));
  }
  fs::path dir_;
};

// Sets the process umask for one scope (the tests are single-threaded).
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(old_); }

 private:
  mode_t old_;
};

fs::perms Perms(const std::string& path) { return fs::status(path).permissions() & fs::perms::all; }

bool IsCharDevice(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

TEST_F(AtomicFileTest, CommitMovesExactBytesIntoPlace) {
  ScopedUmask umask(022);
  const std::string path = Path("out.bin");
  absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(path);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::vector<uint8_t> head = {0x00, 0xFF, 0x7F};
  ASSERT_TRUE(w->Write(head).ok());
  ASSERT_TRUE(w->Write("abc").ok());
  EXPECT_FALSE(fs::exists(path)) << "visible before Commit";
  EXPECT_EQ(Entries(), 1);  // the temporary file
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_EQ(ReadAll(path), std::string("\x00\xFF\x7F"
                                       "abc",
                                       6));
  EXPECT_EQ(Entries(), 1);  // only the file itself
  EXPECT_EQ(Perms(path), fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                             fs::perms::others_read);
  EXPECT_EQ(w->Commit().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->Write("x").code(), absl::StatusCode::kFailedPrecondition);
}

// Writes a 4-byte header with Write, then `body` bytes through MapForWrites (`prefault_threads`)
// from 4 threads at interleaved offsets (dequantctl's parallel streams) and 5 bytes past the
// mapping (pwrite), commits, and checks every byte of the file at `path` and that its space is
// allocated (the mapping's pieces are allocated by whichever thread reaches them first).
void WriteMappedFromThreads(const std::string& path, int64_t body, int prefault_threads = 3) {
  absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(path);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->Write("HDR!").ok());  // 4 bytes at the start, as a .npy preamble
  absl::StatusOr<bool> mapped = w->MapForWrites(4 + body, prefault_threads);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_TRUE(*mapped) << "this test's directory is expected to support fallocate";
  EXPECT_TRUE(w->mapped());
  EXPECT_EQ(fs::file_size(w->temporary_path()), static_cast<uintmax_t>(4 + body));
  EXPECT_EQ(w->MapForWrites(10).status().code(), absl::StatusCode::kFailedPrecondition);
  std::vector<uint8_t> want(static_cast<size_t>(body));
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Thread t writes every kThreads-th piece of 64 KiB + 3 bytes, interleaved with the others.
      constexpr int64_t kPiece = 65536 + 3;
      for (int64_t at = t * kPiece; at < body; at += kThreads * kPiece) {
        const int64_t n = std::min(kPiece, body - at);
        if (!w->WriteAt(4 + at, absl::MakeConstSpan(want.data() + at, static_cast<size_t>(n)))
                 .ok()) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(w->WriteAt(4 + body, absl::MakeConstSpan(want.data(), 5)).ok());  // past the map
  struct stat st;
  ASSERT_EQ(::stat(w->temporary_path().c_str(), &st), 0);
  EXPECT_GE(static_cast<int64_t>(st.st_blocks) * 512, 4 + body) << "space not allocated";
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_FALSE(w->mapped());
  const std::string got = ReadAll(path);
  ASSERT_EQ(got.size(), static_cast<size_t>(4 + body + 5));
  EXPECT_EQ(got.substr(0, 4), "HDR!");
  EXPECT_EQ(std::memcmp(got.data() + 4, want.data(), want.size()), 0);
  EXPECT_EQ(std::memcmp(got.data() + 4 + body, want.data(), 5), 0);
}

// A size that is a multiple of nothing.
constexpr int64_t kOddBody = (int64_t{3} << 20) + 4096 * 3 + 17;

TEST_F(AtomicFileTest, MappedWritesFromThreadsLandExactly) {
  WriteMappedFromThreads(Path("mapped.bin"), kOddBody);
}

// Three 64 MiB allocation pieces and a part of a fourth, allocated by the writers alone (no
// prefault threads), in the order their interleaved writes reach them.
TEST_F(AtomicFileTest, WritersAllocateTheMappingsPiecesThemselves) {
  WriteMappedFromThreads(Path("pieces.bin"), (int64_t{192} << 20) + 4096 + 5,
                         /*prefault_threads=*/0);
}

// A directory on tmpfs (/dev/shm), removed afterwards; empty when there is none.
class TmpfsDir {
 public:
  TmpfsDir() {
    struct statfs st;
    if (::statfs("/dev/shm", &st) != 0 || st.f_type != TMPFS_MAGIC) return;
    std::string templ = "/dev/shm/atomic_file_test.XXXXXX";
    if (::mkdtemp(templ.data()) != nullptr) dir_ = templ;
  }
  ~TmpfsDir() {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  const std::string& path() const { return dir_; }

 private:
  std::string dir_;
};

// On tmpfs (/dev/shm, where the e2e bench's dequantctl rows write): the same bytes as anywhere
// else, for a small file and for one of 256 MiB + 17 (cleared by several threads at Commit).
TEST_F(AtomicFileTest, MappedWritesOnTmpfsLandExactly) {
  TmpfsDir tmpfs;
  if (tmpfs.path().empty()) GTEST_SKIP() << "/dev/shm is not a tmpfs here";
  WriteMappedFromThreads(tmpfs.path() + "/small.bin", kOddBody);
  WriteMappedFromThreads(tmpfs.path() + "/large.bin", (int64_t{256} << 20) + 17);
}

// A file larger than the file system's free space is refused at MapForWrites (fallocate), before
// any byte, with RESOURCE_EXHAUSTED naming the temporary file; the writer stays usable for plain
// writes and leaves nothing once abandoned.
TEST_F(AtomicFileTest, MappingMoreThanTmpfsHoldsIsRefused) {
  TmpfsDir tmpfs;
  if (tmpfs.path().empty()) GTEST_SKIP() << "/dev/shm is not a tmpfs here";
  struct statvfs vfs;
  ASSERT_EQ(::statvfs(tmpfs.path().c_str(), &vfs), 0);
  if (vfs.f_blocks == 0) GTEST_SKIP() << "/dev/shm has no size limit";
  const int64_t too_large = static_cast<int64_t>(vfs.f_blocks) * vfs.f_frsize + (int64_t{1} << 30);
  absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(tmpfs.path() + "/huge.bin");
  ASSERT_TRUE(w.ok()) << w.status();
  const absl::StatusOr<bool> mapped = w->MapForWrites(too_large, /*prefault_threads=*/2);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kResourceExhausted) << mapped.status();
  EXPECT_NE(mapped.status().message().find(w->temporary_path()), std::string::npos)
      << mapped.status();
  EXPECT_FALSE(w->mapped());
  EXPECT_EQ(fs::file_size(w->temporary_path()), 0u);
  EXPECT_TRUE(w->Write("ok").ok());
  w->Abandon();
  EXPECT_TRUE(fs::is_empty(tmpfs.path()));
}

TEST_F(AtomicFileTest, MappedFileAbandonedLeavesNothing) {
  const std::string path = Path("abandoned.bin");
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(path);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->MapForWrites(1 << 20).ok());
  ASSERT_TRUE(
      w->WriteAt(100, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>("xyz"), 3)).ok());
  w->Abandon();
  EXPECT_FALSE(w->mapped());
  EXPECT_EQ(Entries(), 1);
  EXPECT_EQ(ReadAll(path), "old");
  EXPECT_EQ(w->MapForWrites(10).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(AtomicFileTest, DevNullCannotBeMapped) {
  absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create("/dev/null");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->MapForWrites(4096).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(AtomicFileTest, CommitReplacesAnExistingFile) {
  const std::string path = Path("out.txt");
  ASSERT_TRUE(WriteFileAtomically(path, "old contents").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "new").ok());
  EXPECT_EQ(ReadAll(path), "new");
  EXPECT_EQ(Entries(), 1);
}

TEST_F(AtomicFileTest, DestroyedWriterRemovesTemporaryAndKeepsOldFile) {
  const std::string path = Path("out.txt");
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  {
    absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Write("partial").ok());
    EXPECT_EQ(Entries(), 2);
  }
  EXPECT_EQ(Entries(), 1);
  EXPECT_EQ(ReadAll(path), "old");
}

TEST_F(AtomicFileTest, AbandonRemovesTemporaryAndRefusesLaterCalls) {
  absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(Path("out.txt"));
  ASSERT_TRUE(w.ok());
  w->Abandon();
  EXPECT_EQ(Entries(), 0);
  EXPECT_EQ(w->Write("x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->Commit().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(fs::exists(Path("out.txt")));
}

TEST_F(AtomicFileTest, MovedFromWriterOwnsNothing) {
  absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(Path("out.txt"));
  ASSERT_TRUE(w.ok());
  AtomicFileWriter moved = *std::move(w);
  EXPECT_EQ(w->Write("x").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(moved.Write("y").ok());
  ASSERT_TRUE(moved.Commit().ok());
  EXPECT_EQ(ReadAll(Path("out.txt")), "y");
}

TEST_F(AtomicFileTest, MissingDirectoryIsNotFound) {
  EXPECT_EQ(AtomicFileWriter::Create(Path("no/such/dir/out.txt")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(WriteFileAtomically(Path("no/such/dir/out.txt"), "x").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Entries(), 0);
}

TEST_F(AtomicFileTest, RenameOntoADirectoryFailsAndLeavesNoTemporary) {
  fs::create_directory(Path("taken"));
  fs::create_directory(Path("taken/child"));  // a non-empty directory cannot be replaced
  const absl::Status status = WriteFileAtomically(Path("taken"), "x");
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;  // EISDIR
  EXPECT_EQ(Entries(), 1);                                                    // only "taken"
}

// A symlink (relative, in another directory than its target) survives; the file it points to is
// replaced, and the temporary file is made in the target's directory.
TEST_F(AtomicFileTest, SymlinkIsKeptAndItsTargetReplaced) {
  fs::create_directory(Path("data"));
  ASSERT_TRUE(WriteFileAtomically(Path("data/real.bin"), "old").ok());
  fs::create_directory(Path("links"));
  fs::create_symlink("../data/real.bin", Path("links/link.bin"));

  absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(Path("links/link.bin"));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(fs::equivalent(fs::path(w->temporary_path()).parent_path(), Path("data")))
      << w->temporary_path();
  ASSERT_TRUE(w->Write("new contents").ok());
  ASSERT_TRUE(w->Commit().ok());

  EXPECT_TRUE(fs::is_symlink(Path("links/link.bin")));
  EXPECT_EQ(fs::read_symlink(Path("links/link.bin")), fs::path("../data/real.bin"));
  EXPECT_EQ(ReadAll(Path("data/real.bin")), "new contents");
  EXPECT_EQ(std::distance(fs::directory_iterator(Path("data")), fs::directory_iterator()), 1);
  EXPECT_EQ(std::distance(fs::directory_iterator(Path("links")), fs::directory_iterator()), 1);
}

// A chain of links ending at a file that does not exist yet: the file is created there.
TEST_F(AtomicFileTest, DanglingSymlinkChainCreatesItsTarget) {
  fs::create_symlink("second", Path("first"));
  fs::create_symlink(Path("new.bin"), Path("second"));  // absolute
  ASSERT_TRUE(WriteFileAtomically(Path("first"), "abc").ok());
  EXPECT_TRUE(fs::is_symlink(Path("first")));
  EXPECT_TRUE(fs::is_symlink(Path("second")));
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(Path("new.bin"))));
  EXPECT_EQ(ReadAll(Path("new.bin")), "abc");
  EXPECT_EQ(Entries(), 3);
}

TEST_F(AtomicFileTest, SymlinkLoopIsAnError) {
  fs::create_symlink("b", Path("a"));
  fs::create_symlink("a", Path("b"));
  EXPECT_EQ(WriteFileAtomically(Path("a"), "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Entries(), 2);
}

// A FIFO is written in place (no temporary file); it is still a FIFO afterwards.
TEST_F(AtomicFileTest, FifoIsWrittenInPlace) {
  const std::string fifo = Path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // so opening to write works
  ASSERT_GE(reader, 0);
  {
    absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(fifo);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->temporary_path(), "");
    EXPECT_EQ(Entries(), 1);  // only the FIFO
    ASSERT_TRUE(w->Write("through ").ok());
    ASSERT_TRUE(w->Write("the fifo").ok());
    ASSERT_TRUE(w->Commit().ok());
  }
  char buf[64];
  const ssize_t n = ::read(reader, buf, sizeof buf);
  ::close(reader);
  ASSERT_EQ(n, 16);
  EXPECT_EQ(std::string(buf, 16), "through the fifo");
  EXPECT_EQ(fs::symlink_status(fifo).type(), fs::file_type::fifo);
  EXPECT_EQ(Entries(), 1);
}

// An abandoned write into a FIFO removes nothing: the FIFO stays.
TEST_F(AtomicFileTest, AbandonedFifoWriteKeepsTheFifo) {
  const std::string fifo = Path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  {
    absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(fifo);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->Write("partial").ok());
    w->Abandon();
    EXPECT_EQ(w->Commit().code(), absl::StatusCode::kFailedPrecondition);
  }
  ::close(reader);
  EXPECT_EQ(fs::symlink_status(fifo).type(), fs::file_type::fifo);
}

// /dev/null is written in place and stays a character device.
TEST_F(AtomicFileTest, DevNullIsWrittenInPlace) {
  ASSERT_TRUE(IsCharDevice("/dev/null"));
  absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create("/dev/null");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->temporary_path(), "");
  ASSERT_TRUE(w->Write(std::string(100000, 'x')).ok());
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_TRUE(IsCharDevice("/dev/null"));
}

// A symlink to /dev/null (like /dev/stdout -> /proc/self/fd/1 -> a device): written through.
TEST_F(AtomicFileTest, SymlinkToDeviceIsWrittenThrough) {
  fs::create_symlink("/dev/null", Path("null_link"));
  ASSERT_TRUE(WriteFileAtomically(Path("null_link"), "x").ok());
  EXPECT_TRUE(fs::is_symlink(Path("null_link")));
  EXPECT_TRUE(IsCharDevice("/dev/null"));
  EXPECT_EQ(Entries(), 1);
}

// /dev/fd/N of a regular file opened with O_APPEND (the shell's `>> log`): the file is appended
// to in place, not replaced by a file holding only the new bytes.
TEST_F(AtomicFileTest, ProcFdLinkOfARegularFileIsAppendedInPlace) {
  const std::string log = Path("log.txt");
  ASSERT_TRUE(WriteFileAtomically(log, "line 1\n").ok());
  const int fd = ::open(log.c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteFileAtomically("/dev/fd/" + std::to_string(fd), "line 2\n").ok());
  ::close(fd);
  EXPECT_EQ(ReadAll(log), "line 1\nline 2\n");
  EXPECT_EQ(Entries(), 1);
}

// /dev/fd/N of a file opened without O_APPEND (the shell's `> f` around several commands): the
// bytes go at the descriptor's offset and move it, so what the caller writes next follows them
// (a new open of the link would have its own offset: the next write would overwrite them).
TEST_F(AtomicFileTest, OwnDescriptorIsWrittenAtItsOffsetAndMovesIt) {
  const std::string out = Path("shell_out.txt");
  const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "HEADER\n", 7), 7);
  ASSERT_TRUE(WriteFileAtomically("/dev/fd/" + std::to_string(fd), "payload\n").ok());
  ASSERT_EQ(::write(fd, "TRAILER\n", 8), 8);
  ::close(fd);
  EXPECT_EQ(ReadAll(out), "HEADER\npayload\nTRAILER\n");
  EXPECT_EQ(Entries(), 1);
}

// /proc/self/fd/N of a socket, which cannot be opened by path: written through the descriptor.
TEST_F(AtomicFileTest, OwnSocketDescriptorIsWritten) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  ASSERT_TRUE(
      WriteFileAtomically("/proc/self/fd/" + std::to_string(pair[0]), "over a socket").ok());
  ::close(pair[0]);
  char buf[64] = {};
  EXPECT_EQ(::read(pair[1], buf, sizeof buf), 13);
  EXPECT_EQ(std::string(buf), "over a socket");
  ::close(pair[1]);
}

// A descriptor open read-only (`1< file`) is refused by name; the file is untouched.
TEST_F(AtomicFileTest, OwnReadOnlyDescriptorIsFailedPrecondition) {
  const std::string in = Path("read_only_fd.txt");
  ASSERT_TRUE(WriteFileAtomically(in, "keep").ok());
  const int fd = ::open(in.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  const std::string link = "/dev/fd/" + std::to_string(fd);
  const absl::Status s = WriteFileAtomically(link, "x");
  ::close(fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(s.message()),
            "'" + link + "' (descriptor " + std::to_string(fd) + ") is open read-only");
  EXPECT_EQ(ReadAll(in), "keep");
}

// A new file gets 0666 less the umask: 0600 under umask 077, 0640 under 027.
TEST_F(AtomicFileTest, NewFileModeFollowsTheUmask) {
  {
    ScopedUmask umask(077);
    ASSERT_TRUE(WriteFileAtomically(Path("private.bin"), "x").ok());
  }
  EXPECT_EQ(Perms(Path("private.bin")), fs::perms::owner_read | fs::perms::owner_write);
  {
    ScopedUmask umask(027);
    ASSERT_TRUE(WriteFileAtomically(Path("group.bin"), "x").ok());
  }
  EXPECT_EQ(Perms(Path("group.bin")),
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
}

// A replaced file keeps its mode (0400, 0750), whatever the umask.
TEST_F(AtomicFileTest, ReplacedFileKeepsItsMode) {
  ScopedUmask umask(022);
  ASSERT_TRUE(WriteFileAtomically(Path("read_only.bin"), "old").ok());
  fs::permissions(Path("read_only.bin"), fs::perms::owner_read);
  ASSERT_TRUE(WriteFileAtomically(Path("read_only.bin"), "new").ok());
  EXPECT_EQ(ReadAll(Path("read_only.bin")), "new");
  EXPECT_EQ(Perms(Path("read_only.bin")), fs::perms::owner_read);

  ASSERT_TRUE(WriteFileAtomically(Path("script"), "old").ok());
  const fs::perms rwxr_x___ = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec;
  fs::permissions(Path("script"), rwxr_x___);
  ASSERT_TRUE(WriteFileAtomically(Path("script"), "new").ok());
  EXPECT_EQ(Perms(Path("script")), rwxr_x___);
  EXPECT_EQ(Entries(), 2);
}

}  // namespace
}  // namespace dequantd::formats
