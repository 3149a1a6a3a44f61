// PlanLoadStaging (see load_staging_plan.h).
#include "server/model/load_staging_plan.h"

#include <algorithm>

namespace dequantd {

LoadStagingPlan PlanLoadStaging(int threads, int64_t staging_bytes) {
  // Readers before buffers: four buffers only when every reader asked for gets four of 1 MiB
  // (the reads, not the copies, bound a warm load), else two. threads <= staging / (buffers x
  // 1 MiB) makes staging / (buffers x threads) >= 1 MiB, so the chunk (that, rounded down to
  // 4 KiB) is >= 1 MiB and threads x buffers x chunk <= staging.
  LoadStagingPlan plan;
  plan.buffers =
      staging_bytes >= int64_t{std::max(1, threads)} * kLoadBuffersPerThread * kMinLoadChunkBytes
          ? kLoadBuffersPerThread
          : 2;
  plan.threads = static_cast<int>(std::clamp<int64_t>(
      staging_bytes / (plan.buffers * kMinLoadChunkBytes), 1, std::max(1, threads)));
  plan.chunk_bytes =
      std::max<int64_t>(kMinLoadChunkBytes, staging_bytes / (int64_t{plan.buffers} * plan.threads) /
                                                kLoadChunkAlign * kLoadChunkAlign);
  return plan;
}

}  // namespace dequantd
