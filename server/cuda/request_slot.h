// What one request holds on a GPU while it runs: its stream, two pinned staging buffers for
// device -> host copies, and the events that order and time its stages. A LeasePool of them per
// device bounds the requests in flight (server/lease_pool.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "server/cuda/cuda_objects.h"

namespace dequantd::cuda {

struct RequestSlot {
  // Creates a slot on the current device: `staging_bytes` (>= 1) per staging buffer; `timing`
  // makes every event a timing event (an observer wants stage times). Errors: CUDA's (INTERNAL,
  // RESOURCE_EXHAUSTED for pinned memory).
  static absl::StatusOr<std::unique_ptr<RequestSlot>> Create(int64_t staging_bytes, bool timing);

  int64_t staging_bytes = 0;
  UniqueStream stream;
  std::array<UniquePinnedMemory, 2> staging;
  // Per copy buffer parity: before (copy_start) and after (copied) each device -> host piece.
  std::array<UniqueEvent, 2> copy_start, copied;
  // Per slab parity: around each slab's kernel launch.
  std::array<UniqueEvent, 2> kernel_start, kernel_end;
  std::array<UniqueEvent, 2> h2d;  // around the inline input's host -> device copy
};

}  // namespace dequantd::cuda
