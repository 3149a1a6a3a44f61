// Uploading layers straight from the checkpoint's files to one GPU (issue 22): several reader
// threads pread chunks of the stored tensors into their own pinned staging buffers (two each,
// so a thread reads chunk i + 1 while chunk i is copied) and copy them host -> device on their
// own streams. Host memory held: `staging_bytes` of pinned memory, for the upload only; the
// packed model is never copied into host memory. Integrity as ShardReader (server/shard_reader.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "server/checkpoint.h"

namespace dequantd::cuda {

struct ShardUploadOptions {
  int threads = 0;                             // reader threads; 0 = DefaultLoadThreads()
  int64_t staging_bytes = int64_t{256} << 20;  // pinned staging in all (threads x 2 buffers)
  const std::atomic<bool>* cancel = nullptr;   // true: stop with CANCELLED (a shutdown signal)
};

// Copies the stored tensors of checkpoint.layers()[layers[j]] into `device_bases[j]` (device
// memory of the current device, PackedLayout(shape) bytes: each role at its layout offset) and
// waits until they are there. Errors: RESOURCE_EXHAUSTED (the pinned staging cannot be had,
// naming --load-staging-bytes), ShardReader's (ABORTED, DATA_LOSS naming file and tensor),
// CANCELLED, INTERNAL (CUDA).
absl::Status UploadFromShards(const Checkpoint& checkpoint, const std::vector<int64_t>& layers,
                              const std::vector<uint8_t*>& device_bases,
                              const ShardUploadOptions& options);

}  // namespace dequantd::cuda
