// ReadRawTensor: pread a raw checkpoint tensor piece by piece (see raw_tensor.h).
#include "server/raw_tensor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dequantd {

absl::Status ReadRawTensor(
    const RawTensor& tensor, int64_t piece_bytes,
    const std::function<absl::Status(int64_t offset, absl::Span<const uint8_t> bytes)>& consume) {
  if (piece_bytes < 1) {
    return absl::InternalError(absl::StrCat("ReadRawTensor: piece_bytes ", piece_bytes, " < 1"));
  }
  const int fd = ::open(tensor.file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("open '", tensor.file, "' for tensor '", tensor.name, "'"));
  }
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_dev != tensor.device || st.st_ino != tensor.inode) {
    return absl::DataLossError(absl::StrCat("'", tensor.file, "' (tensor '", tensor.name,
                                            "') was replaced since the server loaded it"));
  }
  if (st.st_size < tensor.file_offset + tensor.bytes) {
    return absl::DataLossError(absl::StrCat("'", tensor.file, "' is ", st.st_size,
                                            " bytes, but tensor '", tensor.name, "' ends at byte ",
                                            tensor.file_offset + tensor.bytes,
                                            ": truncated since the server loaded it"));
  }
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

}  // namespace dequantd
