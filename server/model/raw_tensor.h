// The checkpoint's tensors that are not part of a quantized layer (embeddings, norms, biases,
// lm_head): indexed at load time, read from the shard file on demand (issue 10).
//
// Memory choice: only the index (name, dtype, shape, file, byte range, file identity) is kept;
// the bytes are read with pread when a client asks for them, a chunk at a time, so serving them
// costs no resident memory (a 135M model's fp16 embedding alone is 57 MB). The price: the file
// must stay in place while the server runs. A read checks that the path still names the file
// that was indexed (device and inode) and is not shorter than the index says; otherwise the read
// fails with DATA_LOSS instead of returning other bytes.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "server/model/shard_reader.h"

namespace dequantd {

struct RawTensor {
  std::string name;            // e.g. "model.embed_tokens.weight"
  std::string dtype;           // safetensors dtype code as stored: "F16", "BF16", "F32", "I64", ...
  std::vector<int64_t> shape;  // elements per dimension
  std::string file;            // path of the shard holding it
  int64_t file_offset = 0;     // byte offset of its first byte in `file`
  int64_t bytes = 0;           // its size in bytes
  dev_t device = 0;            // identity of `file` when indexed
  ino_t inode = 0;
  // Its modification time then (st_mtim, ns; 0: not checked). A file deleted and written again
  // at the same path can get the same inode number (ext4 reuses freed ones); a rewrite in place
  // keeps it: either changes the modification time.
  int64_t mtime_ns = 0;
};

// st_mtim of `st` in nanoseconds.
inline int64_t ModificationTimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// Reads all of `tensor`'s bytes, in pieces of at most `piece_bytes` (>= 1), in order, handing
// each to `consume(offset, bytes)` (offset from the tensor's first byte); stops at the first
// error `consume` returns. Opens the file for the duration of the call. Errors: NOT_FOUND (the
// file is gone), DATA_LOSS naming file and tensor (replaced or rewritten since indexed, or shorter
// than the index says), the errno of open/pread, `consume`'s (unchanged). Thread-safe (no shared
// state).
absl::Status ReadRawTensor(
    const RawTensor& tensor, int64_t piece_bytes,
    const std::function<absl::Status(int64_t offset, absl::Span<const uint8_t> bytes)>& consume);

// OK when `tensor`'s file is still the file indexed (device, inode and modification time) and holds
// the tensor's bytes; what ReadRawTensor checks before its first read, for a caller that serves the
// bytes from a copy it made earlier. Errors: the errno of open (NOT_FOUND when gone), DATA_LOSS
// (replaced; truncated).
absl::Status CheckRawTensorFile(const RawTensor& tensor);

// Reads all of `tensor`'s bytes with `threads` threads (>= 1) of ShardReader (issue 23: a large
// tensor at the page cache's rate, not one thread's): cut into chunks of at most `chunk_bytes`
// (> 0), each pread to `destination(thread, chunk)` and handed to `consume(thread, chunk, data)`
// on the same thread (chunk.tensor_offset: its offset from the tensor's first byte; chunks in
// no particular order across threads, so both callbacks must be safe to call from `threads`
// threads at once). The first error stops the others. Errors: those of ReadRawTensor (NOT_FOUND,
// DATA_LOSS naming file and tensor: replaced or shorter than indexed, before or during the read),
// DATA_LOSS when the file changed size during the read, the errno of pread, the callbacks' (as
// they returned them, whatever their code).
absl::Status ReadRawTensorChunks(const RawTensor& tensor, int threads, int64_t chunk_bytes,
                                 const ShardReader::Destination& destination,
                                 const ShardReader::Consume& consume);

}  // namespace dequantd
