// How the CUDA load's pinned staging is cut (issue 22; server/backend/cuda/shard_upload.h): reader
// threads x buffers per thread x chunk bytes, within the staging asked for
// (--load-staging-bytes). Host-only arithmetic, so the bound is tested without a GPU.
#pragma once

#include <cstdint>

namespace dequantd {

inline constexpr int64_t kMinLoadChunkBytes = int64_t{1} << 20;  // the least pread / DMA size
inline constexpr int64_t kLoadChunkAlign = 4096;
inline constexpr int kLoadBuffersPerThread = 4;  // 2 when the staging is under 4 MiB

struct LoadStagingPlan {
  int threads = 1;          // reader threads, each with its own copy stream
  int buffers = 2;          // pinned buffers per thread: the pread fills one while the others copy
  int64_t chunk_bytes = 0;  // bytes per buffer (and per pread and DMA at most)
  // Pinned bytes in all: threads x buffers x chunk_bytes.
  int64_t bytes() const { return int64_t{threads} * buffers * chunk_bytes; }
};

// The plan for `threads` (>= 1) reader threads asked for and `staging_bytes` (>= 2 MiB, the
// least the server accepts). Bound: bytes() <= staging_bytes, chunk_bytes >= 1 MiB and a
// multiple of 4 KiB; fewer threads than asked for when the staging cannot give each `buffers` x
// 1 MiB. With the defaults (8 threads, 256 MiB): 8 x 4 x 8 MiB.
LoadStagingPlan PlanLoadStaging(int threads, int64_t staging_bytes);

}  // namespace dequantd
