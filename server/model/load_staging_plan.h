// How a pinned staging for reads from files to a GPU is cut (server/backend/cuda/
// pinned_read_staging.h): the model upload's (issue 22, --load-staging-bytes) and ReadTensor into
// a device region's (issue 23, --read-staging-bytes): reader threads x buffers per thread x chunk
// bytes, within the staging asked for. Host-only arithmetic, so the bound is tested without a
// GPU.
#pragma once

#include <cstdint>

namespace dequantd {

inline constexpr int64_t kMinLoadChunkBytes = int64_t{1} << 20;  // the least pread / DMA size
inline constexpr int64_t kLoadChunkAlign = 4096;
inline constexpr int kLoadBuffersPerThread = 4;  // 2 when not every reader can have 4 x 1 MiB

struct LoadStagingPlan {
  int threads = 1;          // reader threads, each with its own copy stream
  int buffers = 2;          // pinned buffers per thread: the pread fills one while the others copy
  int64_t chunk_bytes = 0;  // bytes per buffer (and per pread and DMA at most)
  // Pinned bytes in all: threads x buffers x chunk_bytes.
  int64_t bytes() const { return int64_t{threads} * buffers * chunk_bytes; }
};

// The plan for `threads` (>= 1) reader threads asked for and `staging_bytes` (>= 2 MiB, the
// least the server accepts). Bound: bytes() <= staging_bytes, chunk_bytes >= 1 MiB and a
// multiple of 4 KiB. Readers are kept before buffers: 4 buffers per thread when the staging
// gives every thread 4 x 1 MiB, else 2, and fewer threads than asked for only when it cannot
// give each 2 x 1 MiB. With the defaults: 8 x 4 x 8 MiB (upload, 256 MiB), 8 x 4 x 2 MiB
// (ReadTensor, 64 MiB).
LoadStagingPlan PlanLoadStaging(int threads, int64_t staging_bytes);

}  // namespace dequantd
