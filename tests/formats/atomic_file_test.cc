// AtomicFileWriter: the file appears only on Commit, with exactly the bytes written; abandoned or
// destroyed writers leave nothing behind; errors carry errno-derived codes.
#include "formats/atomic_file.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace dequantd::formats {
namespace {

namespace fs = std::filesystem;

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
  static std::string ReadAll(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }

  fs::path dir_;
};

TEST_F(AtomicFileTest, CommitMovesExactBytesIntoPlace) {
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
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                fs::perms::others_read);
  EXPECT_EQ(w->Commit().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->Write("x").code(), absl::StatusCode::kFailedPrecondition);
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

}  // namespace
}  // namespace dequantd::formats
