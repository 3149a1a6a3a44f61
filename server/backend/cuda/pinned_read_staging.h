// Pinned staging for reads from files to one GPU (issues 22 and 23): per reader thread two pinned
// host buffers, a stream and an event per buffer. A thread preads chunk i + 1 into one buffer
// while chunk i crosses PCIe from the other (cudaMemcpyAsync on its own stream); a buffer is
// reused only once the event recorded after its last copy has completed. Why pinned: a copy from
// pageable memory is staged by the driver and waits for it; from pinned memory it is one DMA at
// ~55 GB/s on the H200 host. Used by the model upload (shard_upload.cc, the staging freed after
// the load) and by ReadTensor into a device region (staged_tensor_copier.cc, kept for the
// server's life). Host memory held: threads() x 2 x chunk_bytes() pinned bytes.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/backend/cuda/cuda_objects.h"

namespace dequantd::cuda {

class PinnedReadStaging {
 public:
  // Chunks are at least this large: smaller budgets get fewer threads.
  static constexpr int64_t kMinChunkBytes = int64_t{1} << 20;

  // Reader threads and chunk bytes for `threads` wanted (>= 1) within `staging_bytes` pinned in
  // all (threads x 2 buffers): fewer threads when it cannot give each 2 x kMinChunkBytes; the
  // chunk a multiple of 4096.
  struct Shape {
    int threads = 1;
    int64_t chunk_bytes = kMinChunkBytes;
  };
  static Shape ShapeFor(int threads, int64_t staging_bytes);

  // The staging of `shape` on CUDA device `device` (its streams and events are made there).
  // Errors: RESOURCE_EXHAUSTED (cudaHostAlloc refused the pinned memory: the caller names its
  // flag), INTERNAL (CUDA).
  static absl::StatusOr<std::unique_ptr<PinnedReadStaging>> Make(int device, Shape shape);
  ~PinnedReadStaging();  // waits for every copy (Synchronize) before the memory goes

  int threads() const { return shape_.threads; }
  int64_t chunk_bytes() const { return shape_.chunk_bytes; }
  int64_t pinned_bytes() const { return int64_t{shape_.threads} * 2 * shape_.chunk_bytes; }

  // Thread `thread`'s (0..threads()-1) next buffer (chunk_bytes() bytes), once the copy last made
  // from it has completed; makes `device` current on the calling thread. Only thread `thread`
  // calls it and CopyToDevice for that index. INTERNAL on a CUDA error.
  absl::StatusOr<uint8_t*> NextBuffer(int thread);
  // Enqueues the copy of `bytes` (<= chunk_bytes()) from the buffer NextBuffer(thread) returned
  // to device memory `device_dst` on the thread's stream and records the buffer's event; the next
  // NextBuffer(thread) returns the other buffer. INTERNAL on a CUDA error.
  absl::Status CopyToDevice(int thread, uint8_t* device_dst, int64_t bytes);
  // Waits until every copy enqueued has completed (or failed): call before the bytes are said to
  // be on the device, and on every path before the staging is reused by another read. INTERNAL
  // naming the first failure.
  absl::Status Synchronize();

 private:
  struct Reader {
    UniqueStream stream;
    std::array<uint8_t*, 2> buffer{};
    std::array<UniqueEvent, 2> copied;
    std::array<bool, 2> pending{};
    int next = 0;  // the buffer the next chunk is read into
  };
  PinnedReadStaging(int device, Shape shape) : device_(device), shape_(shape) {}
  // The memory, streams and events, on the current device.
  absl::Status Allocate();

  const int device_;
  const Shape shape_;
  UniquePinnedMemory memory_;
  std::vector<Reader> readers_;
};

}  // namespace dequantd::cuda
