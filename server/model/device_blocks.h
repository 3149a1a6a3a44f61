// Where a GPU worker's resident layers go in device memory (issue 22): consecutive layers share
// blocks of at most `block_bytes`, each block one cudaMalloc of exactly the bytes its layers need
// (no slack beyond alignment), so a 70B-shaped model of 560 layers takes 17 allocations of up to
// 2 GiB instead of 560. A layer larger than a block has a block of its own. Host-only arithmetic,
// tested without a GPU; server/backend/cuda/resident_model.cc allocates the blocks.
#pragma once

#include <cstdint>
#include <vector>

namespace dequantd {

struct DeviceBlockPlan {
  std::vector<int64_t> block_bytes;  // bytes of each block, in order
  // Per input buffer: its block (-1 for a size of 0: not held) and its offset there, bytes.
  std::vector<int> block;
  std::vector<int64_t> offset;
};

// Packs buffers of `sizes` bytes (0 = none) in order into blocks of at most `block_bytes` (> 0),
// each buffer at an offset that is a multiple of `align` (> 0, a power of two) within its block.
// Guarantees: buffers do not overlap; offset + size <= its block's bytes; a block holds more
// than one buffer only when their aligned sum fits in `block_bytes`.
DeviceBlockPlan PlanDeviceBlocks(const std::vector<int64_t>& sizes, int64_t block_bytes,
                                 int64_t align);

}  // namespace dequantd
