// Temporary file + fsync + rename (see atomic_file.h).
#include "formats/atomic_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dequantd::formats {

absl::Status ErrnoError(int err, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " '", path, "'"));
}

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path) {
  AtomicFileWriter w;
  w.path_ = path;
  w.tmp_path_ = path + ".tmp.XXXXXX";
  w.fd_ = ::mkstemp(w.tmp_path_.data());
  if (w.fd_ < 0) return ErrnoError(errno, "create temporary file for", path);
  return w;
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_path_(std::move(other.tmp_path_)),
      fd_(std::exchange(other.fd_, -1)) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    tmp_path_ = std::move(other.tmp_path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_path_.c_str());
}

absl::Status AtomicFileWriter::Write(absl::Span<const uint8_t> bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError("AtomicFileWriter: already finished");
  const uint8_t* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write", tmp_path_);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Write(absl::string_view text) {
  return Write(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError("AtomicFileWriter: already finished");
  absl::Status status;
  if (::fchmod(fd_, 0644) != 0) status = ErrnoError(errno, "chmod", tmp_path_);
  if (status.ok() && ::fsync(fd_) != 0) status = ErrnoError(errno, "fsync", tmp_path_);
  if (::close(fd_) != 0 && status.ok()) status = ErrnoError(errno, "close", tmp_path_);
  fd_ = -1;
  if (status.ok() && std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    status = ErrnoError(errno, "rename to", path_);
  }
  if (!status.ok()) ::unlink(tmp_path_.c_str());
  return status;
}

absl::Status WriteFileAtomically(const std::string& path, absl::Span<const uint8_t> contents) {
  absl::StatusOr<AtomicFileWriter> file = AtomicFileWriter::Create(path);
  if (!file.ok()) return file.status();
  if (absl::Status status = file->Write(contents); !status.ok()) return status;
  return file->Commit();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  return WriteFileAtomically(
      path,
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(contents.data()), contents.size()));
}

}  // namespace dequantd::formats
