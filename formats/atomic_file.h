// Atomic file creation for every writer in dequantd (.npy, .safetensors, raw dequantctl output,
// the autotuner's cache). Where the bytes go depends on what `path` is:
//   - a regular file, or nothing (atomic mode): bytes go to a temporary file
//     "<target>.tmp.XXXXXX" in the target's directory (O_CREAT | O_EXCL, so rename() is
//     atomic), which on Commit is fsync'd, closed and renamed over the target. A reader of the
//     target sees the old file or the whole new one, never a part. A writer destroyed (or
//     abandoned) before Commit removes its temporary file. The target is `path` with symlinks
//     resolved: a symlink `path` is kept and the file it points to (which may not exist yet) is
//     replaced. Permissions: a new file gets 0666 less the process umask (applied by the kernel
//     at creation, as for any new file: the umask is never read or changed, so this is
//     thread-safe); a replaced file keeps its permission bits (0777 mask), given at Commit.
//   - anything else that exists (character or block device, FIFO, socket, directory), or a path
//     that reaches a file through /proc (/dev/stdout, /dev/fd/N, /proc/self/fd/N): direct mode.
//     `path` is opened O_WRONLY | O_APPEND (no O_CREAT, no O_TRUNC) and written in place; no
//     temporary file, Commit only closes it, Abandon leaves what was written. A link to one of
//     this process's own descriptors (/dev/stdout, /dev/fd/N, /proc/self/fd/N) is not opened
//     anew: a duplicate of that descriptor is written, so the bytes go where its offset is and
//     move it (a shell's `{ a; dequantctl --out /dev/stdout; b; } > f` keeps all three in
//     order) and a socket works; a descriptor open read-only is FAILED_PRECONDITION. So
//     `--out /dev/null` and `--out /dev/stdout` (a pipe, a socket, a terminal, or a file the
//     shell opened, `>` or `>>`) work and the device or link is never replaced.
// No network code.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dequantd::formats {

// absl::ErrnoToStatus(err, "<what> '<path>'"): ENOENT -> NOT_FOUND, EACCES -> PERMISSION_DENIED,
// and so on. Shared by the file code of this folder.
absl::Status ErrnoError(int err, absl::string_view what, const std::string& path);

// One file being written. Move-only; not thread-safe.
class AtomicFileWriter {
 public:
  // Creates the temporary file next to the target (atomic mode) or opens `path` (direct mode, see
  // above). Errors: errno-derived codes ("create temporary file for '<path>'", "open '<path>'",
  // "stat" / "read link" '<path>'), e.g. NOT_FOUND when the directory does not exist,
  // FAILED_PRECONDITION for a directory (EISDIR), FAILED_PRECONDITION for over 40 links (a loop).
  static absl::StatusOr<AtomicFileWriter> Create(const std::string& path);
  // Whether Create(path) would open `path` in direct mode (written in order, in place: WriteAt is
  // not available); false for a path it would write atomically or cannot resolve.
  static bool WritesInPlace(const std::string& path);

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();  // Abandon() unless committed

  // Appends bytes (short writes and EINTR are retried). Errors: FAILED_PRECONDITION after Commit
  // or Abandon, errno-derived codes ("write '<temporary path>'", or '<path>' in direct mode). A
  // failed write leaves the temporary file in place until Abandon or destruction.
  absl::Status Write(absl::Span<const uint8_t> bytes);
  absl::Status Write(absl::string_view text);
  // Writes bytes at file offset `offset` (pwrite; the append position is not moved). Safe to call
  // from several threads at once for disjoint ranges (and with nothing else running on the
  // writer). Atomic mode only: in direct mode (O_APPEND) FAILED_PRECONDITION. Errors: as Write;
  // into a mapping (MapForWrites), its pieces' allocation ("allocate '<temporary path>'", ENOSPC
  // as RESOURCE_EXHAUSTED) before any byte of the range is stored.
  absl::Status WriteAt(int64_t offset, absl::Span<const uint8_t> bytes) const;

  // Atomic mode: gives the temporary file its final size `bytes` now and maps it, so that WriteAt
  // copies into the mapping instead of calling pwrite. Why: buffered pwrite takes the file's
  // inode lock, so writers of one file on tmpfs or ext4 run one at a time (about 2.3 GB/s on the
  // H200 host whatever their number, issue 22); stores into a shared mapping take no such lock
  // and each writer adds its own rate. Space: the file system's free space must hold `bytes` now
  // (else RESOURCE_EXHAUSTED, before any byte); the space itself is allocated (fallocate) in
  // pieces of 64 MiB, each by the first WriteAt or prefault thread that reaches it, before any
  // store into it, so a file system filled meanwhile is an error of that WriteAt
  // (RESOURCE_EXHAUSTED), never a SIGBUS. (One fallocate of the whole file is a serial step:
  // tmpfs clears every page under the inode lock, 1.9 s for 14 GB on the H100 host; in pieces it
  // runs beside the writers.) Returns false and changes nothing when the file system cannot
  // allocate ahead (EOPNOTSUPP: WriteAt keeps using pwrite). WriteAt past `bytes` uses pwrite.
  // Call before the writers start, at most once.
  // `prefault_threads` > 0: that many threads allocate and fault the mapping in
  // (MADV_POPULATE_WRITE: the kernel maps each page without touching its contents) ahead of the
  // writers, each over one contiguous 1/n of the file, so the writers' own threads mostly only
  // copy; they stop at Commit or Abandon (and do nothing on a kernel older than 5.14); as many
  // threads clear a mapping of 256 MiB or more at Commit (MADV_DONTNEED, then munmap). Errors:
  // FAILED_PRECONDITION (direct mode, after Commit or Abandon, called twice), errno-derived codes
  // ("allocate" / "resize" / "map" '<temporary path>').
  absl::StatusOr<bool> MapForWrites(int64_t bytes, int prefault_threads = 0);
  bool mapped() const { return map_ != nullptr; }

  // Atomic mode: chmod to the replaced file's mode (if any), fsync, close, rename to the target. On
  // any error the temporary file is removed and nothing appears at the target. Direct mode: close.
  // Errors: FAILED_PRECONDITION when called twice or after Abandon, errno-derived codes ("chmod" /
  // "fsync" / "close" '<temporary path>', "rename to '<target>'", "close '<path>'").
  absl::Status Commit();

  // Closes and removes the temporary file (direct mode: only closes); later calls fail with
  // FAILED_PRECONDITION.
  void Abandon();

  const std::string& path() const { return path_; }  // as given to Create
  // The file that Commit replaces: path() with symlinks resolved (atomic mode), else path().
  const std::string& target_path() const { return target_; }
  // "<target>.tmp.XXXXXX"; empty in direct mode (there is nothing to remove on a signal).
  const std::string& temporary_path() const { return tmp_path_; }
  bool direct() const { return tmp_path_.empty(); }

 private:
  AtomicFileWriter() = default;
  const std::string& written_path() const { return direct() ? path_ : tmp_path_; }

  std::string path_;
  std::string target_;
  std::string tmp_path_;    // empty in direct mode
  int fd_ = -1;             // -1 once committed or abandoned
  int keep_mode_ = -1;      // the replaced target's permission bits, -1 for a new file
  uint8_t* map_ = nullptr;  // MapForWrites' mapping of [0, map_bytes_), else null
  int64_t map_bytes_ = 0;
  int unmap_threads_ = 1;  // threads that clear a large mapping before munmap
  class Allocation;        // the pieces of the mapped file allocated so far
  std::unique_ptr<Allocation> allocation_;
  struct Prefault;  // the threads of MapForWrites' prefault_threads
  std::unique_ptr<Prefault> prefault_;
  void Unmap();
};

// Create + Write(contents) + Commit. Errors: as those three.
absl::Status WriteFileAtomically(const std::string& path, absl::Span<const uint8_t> contents);
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace dequantd::formats
