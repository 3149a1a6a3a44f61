// Uploading layers straight from the checkpoint's files to one GPU (issue 22): several reader
// threads pread chunks of the stored tensors into their own pinned staging buffers (up to four
// each, so a thread reads chunk i + 3 while chunks i..i + 2 are copied: the pread never waits for
// the DMA unless the copies fall three chunks behind) and copy them host -> device on their own
// streams (PinnedReadStaging, server/backend/cuda/pinned_read_staging.h). Host memory held: at
// most `staging_bytes` of pinned memory (threads x buffers x chunk <= staging_bytes), for the
// upload only; the packed model is never copied into host memory. Integrity as ShardReader
// (server/model/shard_reader.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/backend/cuda/pinned_read_staging.h"
#include "server/model/checkpoint.h"

namespace dequantd::cuda {

struct ShardUploadOptions {
  int threads = 0;                             // reader threads; 0 = DefaultLoadThreads()
  int64_t staging_bytes = int64_t{256} << 20;  // pinned staging in all (threads x buffers x chunk)
  const std::atomic<bool>* cancel = nullptr;   // true: stop with CANCELLED (a shutdown signal)
};

// The pinned staging of one upload: PlanLoadStaging(threads, staging_bytes) of
// ShardUploadOptions, at most staging_bytes pinned (server/model/load_staging_plan.h).
struct LoadStaging {
  std::unique_ptr<PinnedReadStaging> pinned;
  double pin_seconds = 0;  // making it: the cudaHostAlloc, the streams and events
};

// Allocates the staging for `options` on the current device. Errors: RESOURCE_EXHAUSTED
// (cudaHostAlloc refused it; names --load-staging-bytes), INTERNAL (CUDA).
absl::StatusOr<LoadStaging> AllocateLoadStaging(const ShardUploadOptions& options);

// Where an upload's time went, for the load's log line. Sums are over the reader threads (so a
// sum can exceed the wall time); "wait" is time a reader spent blocked.
struct ShardUploadProfile {
  int threads = 0;
  int buffers = 0;
  int64_t chunk_bytes = 0;
  int64_t staging_bytes = 0;  // pinned, held during the upload
  int64_t chunks = 0;
  int64_t bytes = 0;
  int64_t device_blocks = 0;         // cudaMalloc calls for them (server/model/device_blocks.h)
  double device_alloc_seconds = 0;   // cudaMalloc of the layers (ResidentModel), before the reads
  double pin_seconds = 0;            // making the staging (beside the cudaMallocs)
  double pin_wait_seconds = 0;       // after the cudaMallocs, waiting for the staging
  double read_seconds = 0;           // wall: first read to last read's end
  double drain_seconds = 0;          // wall: after the last read, waiting for the last copies
  double pread_seconds = 0;          // sum over threads: in pread (the page cache or the disk)
  double copy_wait_seconds = 0;      // sum: a buffer's previous copy not done when it was needed
  double issue_seconds = 0;          // sum: cudaMemcpyAsync + cudaEventRecord calls
  double max_pread_seconds = 0;      // the busiest thread's pread time
  double max_copy_wait_seconds = 0;  // the thread that waited longest for copies

  // "upload: 8 threads x 4 buffers x 8 MiB (256 MiB pinned), cudaMalloc 0.061 s, ..." in one line.
  std::string Describe() const;
};

// Copies the stored tensors of checkpoint.layers()[layers[j]] into `device_bases[j]` (memory of
// the staging's device, the one current when AllocateLoadStaging ran; PackedLayout(shape) bytes:
// each role at its layout offset) through `staging` and waits until they are there. Fills `profile`
// (may be null) with the reads' and copies' times. Errors: ShardReader's (ABORTED, DATA_LOSS naming
// file and tensor), CANCELLED, INTERNAL (CUDA).
absl::Status UploadFromShards(const Checkpoint& checkpoint, const std::vector<int64_t>& layers,
                              const std::vector<uint8_t*>& device_bases, const LoadStaging& staging,
                              const ShardUploadOptions& options, ShardUploadProfile* profile);

}  // namespace dequantd::cuda
