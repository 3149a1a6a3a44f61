// Temporary file + fsync + rename, or writing in place for what is not a regular file (see
// atomic_file.h).
#include "formats/atomic_file.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dequantd::formats {
namespace {

constexpr int kMaxSymlinkHops = 40;  // Linux's own limit (MAXSYMLINKS)

struct Resolved {
  std::string path;       // not a symlink (or absent) unless via_proc
  bool via_proc = false;  // stopped at a link in /proc: an open file's link, not a real path
};

// Follows the symlinks of `path` (its last component, hop by hop). The directory part is made
// canonical at each hop (realpath), so relative link targets resolve against the link's own
// directory and /dev/fd/N is seen to live in /proc.
absl::StatusOr<Resolved> ResolveSymlinks(const std::string& path) {
  Resolved r{path};
  for (int hop = 0; hop < kMaxSymlinkHops; ++hop) {
    struct stat st;
    if (::lstat(r.path.c_str(), &st) != 0) {
      if (errno == ENOENT) return r;  // a new file (or a dangling link's target)
      return ErrnoError(errno, "stat", r.path);
    }
    if (!S_ISLNK(st.st_mode)) return r;
    const size_t slash = r.path.rfind('/');
    const std::string dir = slash == std::string::npos ? "."
                            : slash == 0               ? "/"
                                                       : r.path.substr(0, slash);
    char* real_dir = ::realpath(dir.c_str(), nullptr);
    if (real_dir == nullptr) return ErrnoError(errno, "resolve directory", dir);
    const std::string canonical_dir = real_dir;
    std::free(real_dir);
    if (absl::StartsWith(canonical_dir, "/proc/")) {
      r.via_proc = true;
      return r;
    }
    char buf[PATH_MAX];
    const ssize_t n = ::readlink(r.path.c_str(), buf, sizeof buf);
    if (n < 0) return ErrnoError(errno, "read link", r.path);
    if (static_cast<size_t>(n) == sizeof buf) return ErrnoError(ENAMETOOLONG, "read link", r.path);
    const std::string target(buf, static_cast<size_t>(n));
    r.path = target.front() == '/'  ? target
             : canonical_dir == "/" ? "/" + target
                                    : absl::StrCat(canonical_dir, "/", target);
  }
  return absl::FailedPreconditionError(  // ELOOP would map to UNKNOWN
      absl::StrCat("more than ", kMaxSymlinkHops, " symbolic links from '", path, "'"));
}

}  // namespace

absl::Status ErrnoError(int err, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " '", path, "'"));
}

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path) {
  absl::StatusOr<Resolved> resolved = ResolveSymlinks(path);
  if (!resolved.ok()) return resolved.status();
  AtomicFileWriter w;
  w.path_ = path;
  struct stat st;
  if (resolved->via_proc || (::stat(resolved->path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))) {
    w.target_ = path;  // direct mode: written in place, never replaced
    w.fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOCTTY);
    if (w.fd_ < 0) return ErrnoError(errno, "open", path);
    return w;
  }
  w.target_ = resolved->path;
  w.tmp_path_ = w.target_ + ".tmp.XXXXXX";
  w.fd_ = ::mkstemp(w.tmp_path_.data());
  if (w.fd_ < 0) return ErrnoError(errno, "create temporary file for", path);
  return w;
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      target_(std::move(other.target_)),
      tmp_path_(std::move(other.tmp_path_)),
      fd_(std::exchange(other.fd_, -1)) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    target_ = std::move(other.target_);
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
  if (!direct()) ::unlink(tmp_path_.c_str());
}

absl::Status AtomicFileWriter::Write(absl::Span<const uint8_t> bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError("AtomicFileWriter: already finished");
  const uint8_t* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write", written_path());
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
  if (direct()) {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) return ErrnoError(errno, "close", path_);
    return absl::OkStatus();
  }
  absl::Status status;
  if (::fchmod(fd_, 0644) != 0) status = ErrnoError(errno, "chmod", tmp_path_);
  if (status.ok() && ::fsync(fd_) != 0) status = ErrnoError(errno, "fsync", tmp_path_);
  if (::close(fd_) != 0 && status.ok()) status = ErrnoError(errno, "close", tmp_path_);
  fd_ = -1;
  if (status.ok() && std::rename(tmp_path_.c_str(), target_.c_str()) != 0) {
    status = ErrnoError(errno, "rename to", target_);
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
