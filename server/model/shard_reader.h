// Reading a checkpoint's stored tensor bytes after Checkpoint::Open indexed them (issue 22): the
// byte ranges of the layers' stored tensors, cut into chunks and read with pread by several
// threads in parallel, each chunk handed to the caller where it was read (its own memory, or a
// per-thread staging buffer it then copies to a device). Used for the host copies of the layers
// no device holds (Checkpoint::ReadHostCopies), for the CUDA backend's upload straight from
// the files through bounded pinned staging (server/backend/cuda/resident_model.cc), and for
// ReadTensor of a large stored tensor into a device region (ReadRawTensorChunks, issue 23).
//
// Integrity: each shard is opened by path and must still be the file Open parsed (same device
// and inode: ABORTED "replaced" otherwise); a read that ends early is DATA_LOSS naming the file
// and tensor; after the last chunk each shard's size is compared with the size at Open (DATA_LOSS
// "changed size during the load"), so nothing is served from a shard that was truncated, extended
// or rewritten in place while it was read. The headers were validated by Checkpoint::Open; the
// tensor bytes of the formats served have no invalid values (every bit pattern is a weight,
// zero point or scale), so there is nothing else to check before they are trusted.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dequantd {

// A shard as Checkpoint::Open saw it.
struct ShardFile {
  std::string path;
  dev_t device = 0;
  ino_t inode = 0;
  int64_t size = 0;  // bytes
};

// A byte range of a stored tensor in a shard, and where it goes.
struct ReadChunk {
  int shard = -1;           // index into the ShardFile list
  int64_t file_offset = 0;  // bytes from the start of the file
  int64_t bytes = 0;
  int64_t layer = 0;          // the caller's: which layer (for errors: `name_of(layer, role)`)
  int role = 0;               // and which of its stored tensors
  int64_t tensor_offset = 0;  // of this chunk within the tensor, bytes
};

// Cuts each stored tensor range into chunks of at most `max_chunk_bytes` (> 0).
void AppendChunks(int shard, int64_t file_offset, int64_t bytes, int64_t layer, int role,
                  int64_t max_chunk_bytes, std::vector<ReadChunk>* chunks);

class ShardReader {
 public:
  // Opens every shard and checks it is the file described. Errors: the errno of open/fstat
  // (naming the path), ABORTED (replaced: another device or inode than at Open).
  static absl::StatusOr<ShardReader> Open(const std::vector<ShardFile>& shards);
  ShardReader(ShardReader&&) noexcept;
  ShardReader& operator=(ShardReader&&) noexcept;
  ~ShardReader();

  // The name of a chunk's tensor for error messages ("model.layers.0.mlp.up_proj.qweight").
  using NameOf = std::function<std::string(int64_t layer, int role)>;
  // Where chunk `c` is read to by thread `thread` (0..threads-1): a buffer of >= c.bytes bytes.
  using Destination = std::function<absl::StatusOr<uint8_t*>(int thread, const ReadChunk& c)>;
  // Called by the same thread once the chunk's bytes are at `data`.
  using Consume = std::function<absl::Status(int thread, const ReadChunk& c, uint8_t* data)>;

  // Reads every chunk with `threads` threads (>= 1; each takes the next chunk in order, so reads
  // stay close to sequential per shard), calling destination, pread, consume for each. The first
  // error stops the others (they finish the chunk in hand) and is returned; so is CANCELLED when
  // `cancel` (may be null) becomes true. Then checks every shard's size again. Errors: DATA_LOSS
  // (a chunk past the end of its file; a shard that changed size), the errno of pread, CANCELLED,
  // the callbacks'.
  absl::Status Read(const std::vector<ReadChunk>& chunks, int threads, const NameOf& name_of,
                    const Destination& destination, const Consume& consume,
                    const std::atomic<bool>* cancel) const;

 private:
  ShardReader() = default;
  absl::Status ReadOne(const ReadChunk& c, uint8_t* dst, const NameOf& name_of) const;
  std::vector<ShardFile> shards_;
  std::vector<int> fds_;
};

}  // namespace dequantd
