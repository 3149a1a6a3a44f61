// A fixed set of equal host memory blocks lent as reference-counted handles, for bytes whose last
// reader is not known in advance: the CUDA backend DMAs result pieces into pinned blocks and the
// gRPC stream sends them without a copy, so a block is free again only when gRPC has released
// the last slice that points into it (server/backend/cuda/result_pipeline.cc). No CUDA here: the
// memory comes from an injected allocator (cudaHostAlloc in server/backend/cuda/request_slot.cc,
// malloc in the tests), so the pool is tested on the CPU (tests/server/block_pool_test.cc).
//
// Memory bound: `count` blocks of `block_bytes`, allocated once in Create and never more; a
// holder that never lets go (a stalled client) keeps at most all of them, and then the owner's
// next Acquire fails with DEADLINE_EXCEEDED at its deadline instead of waiting forever.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace dequantd {

class BlockPool {
 public:
  // Where the blocks' memory comes from. `allocate(bytes)` returns `bytes` of host memory or an
  // error; `free` gives it back. `free` may run on any thread, and after the pool is destroyed
  // (see ~BlockPool): it must not refer to anything shorter-lived than the process.
  struct Allocator {
    std::function<absl::StatusOr<uint8_t*>(int64_t bytes)> allocate;
    std::function<void(uint8_t*)> free;
  };

  // A lent block: its first byte, shared. The block goes back to the pool (waking one waiting
  // Acquire) when the last copy of the handle is destroyed, on whatever thread that happens.
  // Converts to the std::shared_ptr<const void> of ChunkSink::WriteShared.
  using Block = std::shared_ptr<uint8_t>;

  // `count` (>= 1) blocks of `block_bytes` (>= 1) each; `name` appears in errors (e.g. "the
  // staging blocks of a request slot on cuda:0"). Errors: INVALID_ARGUMENT for a bad count or
  // size, the allocator's (blocks allocated before it failed are freed).
  static absl::StatusOr<std::unique_ptr<BlockPool>> Create(int count, int64_t block_bytes,
                                                           Allocator allocator, std::string name);

  // Blocks that are free now are freed now; a block still lent stays valid and is freed when its
  // last handle is destroyed (gRPC may release a slice after the call, and after its request
  // slot, are gone). So a handle may outlive the pool; Acquire must not run concurrently with
  // the destructor.
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Lends a free block, waiting up to `timeout` for one to come back while all are lent.
  // Thread-safe. Errors: DEADLINE_EXCEEDED naming the pool, its size and the wait, when none came
  // back in time (a holder that never releases, e.g. a transport that never sends).
  absl::StatusOr<Block> Acquire(std::chrono::steady_clock::duration timeout);

  int count() const;
  int64_t block_bytes() const;
  // Blocks not lent right now (a snapshot).
  int free_count() const;

 private:
  struct State;
  explicit BlockPool(std::shared_ptr<State> state) : state_(std::move(state)) {}

  std::shared_ptr<State> state_;  // shared with every lent block
};

}  // namespace dequantd
