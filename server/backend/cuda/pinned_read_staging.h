// Pinned staging for reads from files to one GPU (issues 22 and 23), the one implementation the
// server's two such paths share (one staging per upload, one per GPU for ReadTensor):
// plan.threads reader threads, each with plan.buffers pinned host buffers of
// plan.chunk_bytes (server/model/load_staging_plan.h), its own copy stream and an event per
// buffer. A thread preads its next chunk into one buffer while its earlier chunks cross PCIe from
// the others (cudaMemcpyAsync on its stream); a buffer is reused only once the event recorded after
// its last copy has completed, so the pread waits for a DMA only when the copies fall
// plan.buffers - 1 chunks behind. Why pinned: a copy from pageable memory is staged by the driver
// and waits for it; from pinned memory it is one DMA at ~55 GB/s on the H200 host. Used by the
// model upload (shard_upload.cc, freed after the load) and by ReadTensor into a device region
// (staged_tensor_copier.cc, kept for the server's life). Host memory held: plan.bytes() pinned.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/backend/cuda/cuda_objects.h"
#include "server/model/load_staging_plan.h"

namespace dequantd::cuda {

class PinnedReadStaging {
 public:
  // The staging of `plan` (PlanLoadStaging's: 1 <= buffers <= kLoadBuffersPerThread) on CUDA
  // device `device`: its memory, streams and events are made there; the calling thread's current
  // device is left as it was. Errors: RESOURCE_EXHAUSTED (cudaHostAlloc refused the pinned memory:
  // the caller names its flag), INTERNAL (CUDA).
  static absl::StatusOr<std::unique_ptr<PinnedReadStaging>> Make(int device, LoadStagingPlan plan);
  ~PinnedReadStaging();  // waits for every copy (Synchronize) before the memory goes

  const LoadStagingPlan& plan() const { return plan_; }
  int threads() const { return plan_.threads; }
  int64_t chunk_bytes() const { return plan_.chunk_bytes; }
  int64_t pinned_bytes() const { return plan_.bytes(); }

  // Thread `thread`'s (0..threads()-1) next buffer (chunk_bytes() bytes), once the copy last made
  // from it has completed (the only wait of a reader on the DMA: its seconds are added to
  // `*waited_seconds` when given); makes the staging's device current on the calling thread. Only
  // thread `thread` calls it and CopyToDevice for that index. INTERNAL on a CUDA error.
  absl::StatusOr<uint8_t*> NextBuffer(int thread, double* waited_seconds = nullptr);
  // Enqueues the copy of `bytes` (<= chunk_bytes()) from `buffer`, the one NextBuffer(thread) last
  // returned (INTERNAL otherwise), to device memory `device_dst` on the thread's stream and records
  // the buffer's event; the next NextBuffer(thread) returns the thread's next buffer. INTERNAL on a
  // CUDA error.
  absl::Status CopyToDevice(int thread, const uint8_t* buffer, uint8_t* device_dst, int64_t bytes);
  // Waits until every copy enqueued has completed (or failed): call before the bytes are said to
  // be on the device, and on every path before the staging is reused by another read. INTERNAL
  // naming the first failure.
  absl::Status Synchronize();

 private:
  struct Reader {
    UniqueStream stream;
    std::array<uint8_t*, kLoadBuffersPerThread> buffer{};
    std::array<UniqueEvent, kLoadBuffersPerThread> copied;
    std::array<bool, kLoadBuffersPerThread> pending{};
    int next = 0;  // the buffer the next chunk is read into
  };
  PinnedReadStaging(int device, LoadStagingPlan plan) : device_(device), plan_(plan) {}
  // The memory, streams and events, on the current device.
  absl::Status Allocate();

  const int device_;
  const LoadStagingPlan plan_;
  UniquePinnedMemory memory_;
  std::vector<Reader> readers_;
};

}  // namespace dequantd::cuda
