// Atomic file creation for every writer in dequantd (.npy, .safetensors, raw dequantctl output,
// the autotuner's cache): bytes go to a temporary file "<path>.tmp.XXXXXX" in the same directory
// (mkstemp, so rename() is atomic), which on Commit is given mode 0644, fsync'd, closed and
// renamed over `path`. A reader of `path` sees the old file or the whole new one, never a part.
// A writer destroyed (or abandoned) before Commit removes its temporary file. No network code.
#pragma once

#include <cstdint>
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
  // Creates the temporary file next to `path`. Errors: errno-derived codes ("create temporary
  // file for '<path>'"), e.g. NOT_FOUND when the directory does not exist.
  static absl::StatusOr<AtomicFileWriter> Create(const std::string& path);

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();  // Abandon() unless committed

  // Appends bytes (short writes and EINTR are retried). Errors: FAILED_PRECONDITION after Commit
  // or Abandon, errno-derived codes ("write '<temporary path>'"). A failed write leaves the
  // temporary file in place until Abandon or destruction.
  absl::Status Write(absl::Span<const uint8_t> bytes);
  absl::Status Write(absl::string_view text);

  // chmod 0644, fsync, close, rename to `path`. On any error the temporary file is removed and
  // nothing appears at `path`. Errors: FAILED_PRECONDITION when called twice or after Abandon,
  // errno-derived codes ("chmod" / "fsync" / "close" '<temporary path>', "rename to '<path>'").
  absl::Status Commit();

  // Closes and removes the temporary file; later calls fail with FAILED_PRECONDITION.
  void Abandon();

  const std::string& path() const { return path_; }
  const std::string& temporary_path() const { return tmp_path_; }

 private:
  AtomicFileWriter() = default;

  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;  // -1 once committed or abandoned
};

// Create + Write(contents) + Commit. Errors: as those three.
absl::Status WriteFileAtomically(const std::string& path, absl::Span<const uint8_t> contents);
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace dequantd::formats
