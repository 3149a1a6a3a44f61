// An L2 flush for measurements that must start from a clean cache: reads a device buffer of
// kFlushL2Multiple times the L2's size, so that every line that earlier work left in L2 (dirty
// output lines above all) is evicted -- and written back to DRAM -- before the next kernel runs.
// The next kernel then misses on everything it reads and its DRAM writes are its own, which is the
// state Nsight Compute's default `--cache-control all` gives each profiled pass. Used by
// MeasureCounters (measure/hw_counters.h). CUDA builds only. Not thread-safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "measure/cuda_timing.h"

namespace dequantd::bench {

// How many L2 sizes the flush reads: L2 replacement is not strict LRU, so one L2's worth does not
// evict everything; four does (240 MB on the H200, about 60 us of reading).
inline constexpr int kFlushL2Multiple = 4;

class L2Flush {
 public:
  // Allocates kFlushL2Multiple x the current device's L2 (cudaDevAttrL2CacheSize) and zeroes it
  // on `stream` (so Enqueue on the same stream sees zeros). Errors: RESOURCE_EXHAUSTED when the
  // buffer does not fit; other CUDA errors as INTERNAL.
  static absl::StatusOr<L2Flush> Create(cudaStream_t stream);

  // Enqueues the read of the whole buffer on `stream` (one kernel, nothing written back but L2's
  // own evictions). Errors: the launch's CUDA error.
  absl::Status Enqueue(cudaStream_t stream) const;

  int64_t bytes() const { return bytes_; }

 private:
  L2Flush(DeviceBuffer buffer, int64_t bytes, int blocks)
      : buffer_(std::move(buffer)), bytes_(bytes), blocks_(blocks) {}
  DeviceBuffer buffer_;  // bytes_ zeroed bytes, then a 4-byte sink the kernel never writes
  int64_t bytes_ = 0;
  int blocks_ = 1;  // 4 per SM
};

}  // namespace dequantd::bench
