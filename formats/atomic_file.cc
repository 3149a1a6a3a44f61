// Temporary file + fsync + rename, or writing in place for what is not a regular file (see
// atomic_file.h).
#include "formats/atomic_file.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dequantd::formats {
namespace {

constexpr int kMaxSymlinkHops = 40;  // Linux's own limit (MAXSYMLINKS)

struct Resolved {
  std::string path;       // not a symlink (or absent) unless via_proc
  bool via_proc = false;  // stopped at a link in /proc: an open file's link, not a real path
  int own_fd = -1;        // via_proc: this process's descriptor the link names, else -1
};

// N when `link` (in the canonical directory `dir`) is /proc/self/fd/N or /proc/<our pid>/fd/N,
// the link behind /dev/stdout and /dev/fd/N; else -1.
int OwnDescriptor(const std::string& dir, const std::string& link) {
  if (dir != absl::StrCat("/proc/", ::getpid(), "/fd") && dir != "/proc/self/fd") return -1;
  int fd = -1;
  const std::string name = link.substr(link.rfind('/') + 1);
  return absl::SimpleAtoi(name, &fd) && fd >= 0 ? fd : -1;
}

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
      r.own_fd = OwnDescriptor(canonical_dir, r.path);
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

// Creates "<target>.tmp.XXXXXX" (a random suffix of [A-Za-z0-9]) with open(O_CREAT | O_EXCL,
// mode), read-write (a shared writable mapping needs it: MapForWrites): unlike mkstemp's fixed
// 0600, the kernel applies the process umask (or the directory's default ACL) to `mode`, as for any
// new file, without reading or changing the umask. Returns the descriptor, or -1 with errno set.
int CreateTemporary(const std::string& target, mode_t mode, std::string* tmp_path) {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device random;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string name = target + ".tmp.";
    for (int i = 0; i < 6; ++i) name.push_back(kChars[random() % (sizeof kChars - 1)]);
    const int fd = ::open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EEXIST) {
      *tmp_path = std::move(name);
      return fd;
    }
  }
  errno = EEXIST;
  return -1;
}

}  // namespace

absl::Status ErrnoError(int err, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " '", path, "'"));
}

namespace {

// Direct mode: a path through /proc, or one that exists and is not a regular file.
bool IsDirect(const Resolved& resolved) {
  struct stat st;
  return resolved.via_proc || (::stat(resolved.path.c_str(), &st) == 0 && !S_ISREG(st.st_mode));
}

}  // namespace

bool AtomicFileWriter::WritesInPlace(const std::string& path) {
  absl::StatusOr<Resolved> resolved = ResolveSymlinks(path);
  return resolved.ok() && IsDirect(*resolved);
}

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path) {
  absl::StatusOr<Resolved> resolved = ResolveSymlinks(path);
  if (!resolved.ok()) return resolved.status();
  AtomicFileWriter w;
  w.path_ = path;
  if (IsDirect(*resolved)) {
    w.target_ = path;  // direct mode: written in place, never replaced
    if (resolved->own_fd >= 0) {
      // One of our own descriptors (/dev/stdout): written through a duplicate of it, so that the
      // bytes land at its offset and move it (a file the shell opened with '>' gets what follows
      // after them), and sockets, which cannot be opened by path, work too.
      const int flags = ::fcntl(resolved->own_fd, F_GETFL);
      if (flags < 0) return ErrnoError(errno, "use descriptor", path);
      if ((flags & O_ACCMODE) == O_RDONLY) {
        return absl::FailedPreconditionError(
            absl::StrCat("'", path, "' (descriptor ", resolved->own_fd, ") is open read-only"));
      }
      w.fd_ = ::fcntl(resolved->own_fd, F_DUPFD_CLOEXEC, 0);
      if (w.fd_ < 0) return ErrnoError(errno, "use descriptor", path);
      return w;
    }
    w.fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOCTTY);
    if (w.fd_ < 0) return ErrnoError(errno, "open", path);
    return w;
  }
  w.target_ = resolved->path;
  // A new file: 0666 less the umask, applied at creation. Replacing a file: its permission bits,
  // given at Commit (the temporary file is 0600 until then, as private as any target).
  mode_t create_mode = 0666;
  if (struct stat st; ::stat(w.target_.c_str(), &st) == 0) {
    w.keep_mode_ = static_cast<int>(st.st_mode & 0777);
    create_mode = 0600;
  }
  w.fd_ = CreateTemporary(w.target_, create_mode, &w.tmp_path_);
  if (w.fd_ < 0) {
    w.tmp_path_.clear();
    return ErrnoError(errno, "create temporary file for", path);
  }
  return w;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

// How much one MADV_POPULATE_WRITE call faults in: small enough for Commit's stop to be prompt.
constexpr int64_t kPrefaultStep = int64_t{16} << 20;

// Part t of [0, bytes) cut into n page-aligned contiguous parts (empty past the end).
std::pair<int64_t, int64_t> PagePart(int64_t bytes, int n, int t) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t part = ((bytes + n - 1) / n + page - 1) / page * page;
  const int64_t begin = std::min(bytes, t * part);
  return {begin, std::min(bytes, begin + part)};
}

// Runs fn(begin, end) over PagePart's n parts of [0, bytes) on n threads (the calling thread
// takes the last part) and waits for them.
template <typename Fn>
void OnParts(int64_t bytes, int n, Fn fn) {
  std::vector<std::thread> threads;
  for (int t = 0; t + 1 < n; ++t) {
    const std::pair<int64_t, int64_t> part = PagePart(bytes, n, t);
    if (part.first < part.second) {
      threads.emplace_back([fn, part] { fn(part.first, part.second); });
    }
  }
  const auto [last, end] = PagePart(bytes, n, n - 1);
  if (last < end) fn(last, end);
  for (std::thread& t : threads) t.join();
}

// Mappings at least this large are unmapped by several threads (Unmap).
constexpr int64_t kParallelUnmapBytes = int64_t{256} << 20;

// MapForWrites' space is allocated (fallocate) in pieces of this size, each the first time a
// writer or a prefault thread reaches it.
constexpr int64_t kAllocPiece = int64_t{64} << 20;

// The pieces of the mapped file allocated so far. Why in pieces: fallocate on tmpfs allocates and
// clears every page on the calling thread under the inode lock (1.9 s for 14 GB on the H100
// host, issue 22); for the whole file at once that was a serial step before the first byte was
// received. In pieces it runs beside the writers. Pieces are allocated one at a time (the inode
// lock serializes them anyway); a piece already allocated costs one atomic load.
class AtomicFileWriter::Allocation {
 public:
  // The first piece is already allocated (MapForWrites allocates it to learn whether the file
  // system can allocate ahead at all).
  Allocation(int fd, const std::string& path, int64_t bytes)
      : fd_(fd),
        path_(path),
        bytes_(bytes),
        done_(new std::atomic<bool>[static_cast<size_t>((bytes + kAllocPiece - 1) / kAllocPiece)]) {
    for (int64_t p = 0; p * kAllocPiece < bytes; ++p) done_[p].store(p == 0);
  }

  // Allocates every piece that [begin, end) touches and is not allocated yet. Errors: the
  // errno-derived code of fallocate ("allocate '<path>'"; ENOSPC: RESOURCE_EXHAUSTED).
  absl::Status Ensure(int64_t begin, int64_t end) {
    for (int64_t p = begin / kAllocPiece; p * kAllocPiece < std::min(end, bytes_); ++p) {
      if (done_[p].load(std::memory_order_acquire)) continue;
      std::lock_guard<std::mutex> lock(mu_);
      if (done_[p].load(std::memory_order_relaxed)) continue;
      const int64_t at = p * kAllocPiece;
      if (const int err = Fallocate(fd_, at, std::min(kAllocPiece, bytes_ - at)); err != 0) {
        return ErrnoError(err, "allocate", path_);
      }
      done_[p].store(true, std::memory_order_release);
    }
    return absl::OkStatus();
  }

  // posix_fallocate of [at, at + len), EINTR retried: 0 or the error number.
  static int Fallocate(int fd, int64_t at, int64_t len) {
    int err;
    do {
      err = ::posix_fallocate(fd, static_cast<off_t>(at), static_cast<off_t>(len));
    } while (err == EINTR);
    return err;
  }

 private:
  const int fd_;
  const std::string path_;
  const int64_t bytes_;
  std::unique_ptr<std::atomic<bool>[]> done_;
  std::mutex mu_;
};

struct AtomicFileWriter::Prefault {
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;

  // Each step's pieces are allocated first (a failure stops the thread: the writer that reaches
  // the piece gets the error).
  Prefault(uint8_t* map, int64_t bytes, int n, Allocation* allocation) {
    for (int t = 0; t < n; ++t) {
      const std::pair<int64_t, int64_t> part = PagePart(bytes, n, t);
      threads.emplace_back([this, map, part, allocation] {
        const auto [begin, end] = part;
        for (int64_t at = begin; at < end && !stop.load(std::memory_order_relaxed);
             at += kPrefaultStep) {
          const int64_t len = std::min(kPrefaultStep, end - at);
          if (!allocation->Ensure(at, at + len).ok()) return;
          if (::madvise(map + at, static_cast<size_t>(len), MADV_POPULATE_WRITE) != 0 &&
              errno != EINTR) {
            return;
          }
        }
      });
    }
  }
  ~Prefault() {
    stop = true;
    for (std::thread& t : threads) t.join();
  }
};

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      target_(std::move(other.target_)),
      tmp_path_(std::move(other.tmp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      keep_mode_(other.keep_mode_),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      unmap_threads_(other.unmap_threads_),
      allocation_(std::move(other.allocation_)),
      prefault_(std::move(other.prefault_)) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    target_ = std::move(other.target_);
    tmp_path_ = std::move(other.tmp_path_);
    fd_ = std::exchange(other.fd_, -1);
    keep_mode_ = other.keep_mode_;
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    unmap_threads_ = other.unmap_threads_;
    allocation_ = std::move(other.allocation_);
    prefault_ = std::move(other.prefault_);
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Unmap() {
  prefault_.reset();  // before the mapping and the allocation go
  allocation_.reset();
  if (map_ == nullptr) return;
  // munmap of a large mapping is one thread clearing every page-table entry (~0.2 s per 3.5 GB
  // on the development VM, on the caller's path: issue 22). MADV_DONTNEED does that part under
  // the mmap read lock, so several threads clear their own parts at once; for a shared file
  // mapping it only drops the entries (dirty pages stay in the page cache, marked dirty).
  if (unmap_threads_ > 1 && map_bytes_ >= kParallelUnmapBytes) {
    uint8_t* const map = map_;
    OnParts(map_bytes_, unmap_threads_, [map](int64_t begin, int64_t end) {
      ::madvise(map + begin, static_cast<size_t>(end - begin), MADV_DONTNEED);
    });
  }
  ::munmap(map_, static_cast<size_t>(map_bytes_));
  map_ = nullptr;
  map_bytes_ = 0;
}

void AtomicFileWriter::Abandon() {
  Unmap();
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

absl::Status AtomicFileWriter::WriteAt(int64_t offset, absl::Span<const uint8_t> bytes) const {
  if (fd_ < 0) return absl::FailedPreconditionError("AtomicFileWriter: already finished");
  if (direct()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", path_, "' is not a regular file: it is written in order, not at offsets"));
  }
  if (map_ != nullptr && offset >= 0 && offset <= map_bytes_ - static_cast<int64_t>(bytes.size())) {
    // The range's space first: a full file system is an error here, never a SIGBUS in memcpy.
    const int64_t end = offset + static_cast<int64_t>(bytes.size());
    if (absl::Status s = allocation_->Ensure(offset, end); !s.ok()) return s;
    std::memcpy(map_ + offset, bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  const uint8_t* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write", written_path());
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += w;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> AtomicFileWriter::MapForWrites(int64_t bytes, int prefault_threads) {
  if (fd_ < 0) return absl::FailedPreconditionError("AtomicFileWriter: already finished");
  if (direct()) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path_, "' is not a regular file: it cannot be mapped"));
  }
  if (map_ != nullptr) return absl::FailedPreconditionError("AtomicFileWriter: already mapped");
  if (bytes <= 0) return false;
  // The whole size must fit now (the pieces are allocated later, beside the writers): refused
  // before any byte, as one fallocate of the whole file would be.
  struct statvfs vfs;
  if (::fstatvfs(fd_, &vfs) == 0 && vfs.f_blocks > 0 &&
      static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize) < bytes) {
    return ErrnoError(ENOSPC, absl::StrCat("allocate ", bytes, " bytes for"), tmp_path_);
  }
  // The first piece now: a file system that cannot allocate ahead says so here.
  if (const int err = Allocation::Fallocate(fd_, 0, std::min(kAllocPiece, bytes)); err != 0) {
    if (err == EOPNOTSUPP || err == EINVAL) return false;  // e.g. a file system without fallocate
    return ErrnoError(err, "allocate", tmp_path_);
  }
  if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
    return ErrnoError(errno, "resize", tmp_path_);
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_WRITE, MAP_SHARED, fd_, 0);
  if (map == MAP_FAILED) return ErrnoError(errno, "map", tmp_path_);
  map_ = static_cast<uint8_t*>(map);
  map_bytes_ = bytes;
  allocation_ = std::make_unique<Allocation>(fd_, tmp_path_, bytes);
  unmap_threads_ = std::max(1, prefault_threads);
  if (prefault_threads > 0) {
    prefault_ = std::make_unique<Prefault>(map_, bytes, prefault_threads, allocation_.get());
  }
  return true;
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
  Unmap();  // the stores are in the page cache: fsync below writes them out
  absl::Status status;
  if (keep_mode_ >= 0 && ::fchmod(fd_, static_cast<mode_t>(keep_mode_)) != 0)
    status = ErrnoError(errno, "chmod", tmp_path_);
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
