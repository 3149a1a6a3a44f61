// What one request holds on a GPU while it runs: its stream, a pool of pinned staging blocks for
// device -> host copies, two pinned upload buffers for host -> device staging, and the events that
// order and time its stages. A LeasePool of them per device bounds the requests in flight
// (server/backend/lease_pool.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/backend/block_pool.h"
#include "server/backend/cuda/cuda_objects.h"

namespace dequantd::cuda {

struct RequestSlot {
  // Creates a slot on the current device: `staging_blocks` (>= 2) pinned blocks of
  // `staging_bytes` (>= 1) each and two upload buffers (cudaHostAlloc); `timing` makes every event
  // a timing event (an observer wants stage times); `label` (e.g. "cuda:0") names the device in
  // errors. Errors: INVALID_ARGUMENT for fewer than 2 blocks, CUDA's (INTERNAL, RESOURCE_EXHAUSTED
  // for pinned memory).
  static absl::StatusOr<std::unique_ptr<RequestSlot>> Create(int64_t staging_bytes,
                                                             int staging_blocks, bool timing,
                                                             const std::string& label);

  int64_t staging_bytes = 0;
  // Where device -> host pieces land when the sink has no destination. A block is lent to one
  // piece; the sink may keep it (the gRPC stream holds it until gRPC has sent the bytes), so it
  // returns to the pool when gRPC releases it, possibly after the call and this slot are gone
  // (the block's memory stays valid until then: BlockPool). Declared before the stream, so it is
  // destroyed after it.
  std::unique_ptr<BlockPool> staging;
  UniqueStream stream;
  // Per copy parity (piece i uses i % 2): before (copy_start) and after (copied) each
  // device -> host piece; at most two pieces are in flight.
  std::array<UniqueEvent, 2> copy_start, copied;
  // Per slab parity: around each slab's kernel launch.
  std::array<UniqueEvent, 2> kernel_start, kernel_end;
  // Per slab parity: around the slab's host -> device staging (its inline input or the host
  // copies of layers no GPU holds).
  std::array<UniqueEvent, 2> h2d_start, h2d_end;
  // Host -> device staging (host_staging.h): two pinned buffers of kUploadBufferBytes, and the
  // event recorded after the last DMA out of each.
  std::array<UniquePinnedMemory, 2> upload;
  std::array<UniqueEvent, 2> uploaded;
};

// Bytes of each of a slot's two pinned upload buffers: 8 MiB per slot, 32 MiB per GPU with the
// default 4 slots.
inline constexpr int64_t kUploadBufferBytes = int64_t{4} << 20;

}  // namespace dequantd::cuda
