// ReadRawTensor: pread a raw checkpoint tensor piece by piece (see raw_tensor.h).
#include "server/model/raw_tensor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace dequantd {

namespace {

absl::Status ReplacedError(const RawTensor& tensor) {
  return absl::DataLossError(absl::StrCat("'", tensor.file, "' (tensor '", tensor.name,
                                          "') was replaced since the server loaded it"));
}

// Opens `tensor`'s file and checks it is the file indexed, at least as long as the index says;
// returns the descriptor (the caller closes it) and the file's size. Errors: the errno of open
// (NOT_FOUND when gone), DATA_LOSS (replaced; truncated).
absl::StatusOr<int> OpenChecked(const RawTensor& tensor, int64_t* size) {
  const int fd = ::open(tensor.file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("open '", tensor.file, "' for tensor '", tensor.name, "'"));
  }
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_dev != tensor.device || st.st_ino != tensor.inode) {
    return ReplacedError(tensor);
  }
  if (st.st_size < tensor.file_offset + tensor.bytes) {
    return absl::DataLossError(absl::StrCat("'", tensor.file, "' is ", st.st_size,
                                            " bytes, but tensor '", tensor.name, "' ends at byte ",
                                            tensor.file_offset + tensor.bytes,
                                            ": truncated since the server loaded it"));
  }
  if (tensor.mtime_ns != 0 && ModificationTimeNs(st) != tensor.mtime_ns) {
    return absl::DataLossError(absl::StrCat("'", tensor.file, "' (tensor '", tensor.name,
                                            "') was replaced or rewritten since the server loaded "
                                            "it (its modification time changed)"));
  }
  *size = st.st_size;
  std::move(close_fd).Cancel();
  return fd;
}

}  // namespace

absl::Status ReadRawTensor(
    const RawTensor& tensor, int64_t piece_bytes,
    const std::function<absl::Status(int64_t offset, absl::Span<const uint8_t> bytes)>& consume) {
  if (piece_bytes < 1) {
    return absl::InternalError(absl::StrCat("ReadRawTensor: piece_bytes ", piece_bytes, " < 1"));
  }
  int64_t file_size = 0;
  absl::StatusOr<int> opened = OpenChecked(tensor, &file_size);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  std::vector<uint8_t> buffer(static_cast<size_t>(std::min(piece_bytes, tensor.bytes)));
  int64_t done = 0;
  while (done < tensor.bytes) {
    const int64_t want = std::min<int64_t>(tensor.bytes - done, piece_bytes);
    int64_t filled = 0;
    while (filled < want) {
      const ssize_t got = ::pread(fd, buffer.data() + filled, static_cast<size_t>(want - filled),
                                  tensor.file_offset + done + filled);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        return absl::ErrnoToStatus(
            errno, absl::StrCat("read '", tensor.file, "' tensor '", tensor.name, "'"));
      }
      if (got == 0) {
        return absl::DataLossError(absl::StrCat("'", tensor.file, "': tensor '", tensor.name,
                                                "' ends early (truncated while being read)"));
      }
      filled += got;
    }
    if (absl::Status s =
            consume(done, absl::MakeConstSpan(buffer.data(), static_cast<size_t>(want)));
        !s.ok()) {
      return s;
    }
    done += want;
  }
  return absl::OkStatus();
}

absl::Status CheckRawTensorFile(const RawTensor& tensor) {
  int64_t file_size = 0;
  absl::StatusOr<int> opened = OpenChecked(tensor, &file_size);
  if (!opened.ok()) return opened.status();
  ::close(*opened);
  return absl::OkStatus();
}

absl::Status ReadRawTensorChunks(const RawTensor& tensor, int threads, int64_t chunk_bytes,
                                 const ShardReader::Destination& destination,
                                 const ShardReader::Consume& consume) {
  if (chunk_bytes < 1 || threads < 1) {
    return absl::InternalError(
        absl::StrCat("ReadRawTensorChunks: chunk_bytes ", chunk_bytes, ", threads ", threads));
  }
  int64_t file_size = 0;
  absl::StatusOr<int> opened = OpenChecked(tensor, &file_size);
  if (!opened.ok()) return opened.status();
  ::close(*opened);
  // ShardReader opens the file again and checks it is the same file (ABORTED otherwise: here
  // DATA_LOSS, as ReadRawTensor says it) and, after the last chunk, of the same size.
  absl::StatusOr<ShardReader> reader = ShardReader::Open({ShardFile{
      .path = tensor.file, .device = tensor.device, .inode = tensor.inode, .size = file_size}});
  if (!reader.ok()) {
    return reader.status().code() == absl::StatusCode::kAborted ? ReplacedError(tensor)
                                                                : reader.status();
  }
  std::vector<ReadChunk> chunks;
  AppendChunks(/*shard=*/0, tensor.file_offset, tensor.bytes, /*layer=*/0, /*role=*/0, chunk_bytes,
               &chunks);
  // ShardReader's ABORTED for a file that is not the one opened is DATA_LOSS here; an error of
  // the caller's own callbacks (any code, ABORTED too) comes back unchanged.
  std::atomic<bool> callers_error{false};
  const absl::Status read = reader->Read(
      chunks, threads, [&](int64_t, int) { return tensor.name; },
      [&](int thread, const ReadChunk& c) -> absl::StatusOr<uint8_t*> {
        absl::StatusOr<uint8_t*> dst = destination(thread, c);
        if (!dst.ok()) callers_error = true;
        return dst;
      },
      [&](int thread, const ReadChunk& c, uint8_t* data) {
        absl::Status s = consume(thread, c, data);
        if (!s.ok()) callers_error = true;
        return s;
      },
      /*cancel=*/nullptr);
  if (read.code() == absl::StatusCode::kAborted && !callers_error) return ReplacedError(tensor);
  return read;
}

}  // namespace dequantd
