// BlockPool (see block_pool.h).
#include "server/backend/block_pool.h"

#include <condition_variable>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dequantd {

// Shared by the pool and every lent block (each block's deleter holds a reference): whichever of
// them goes last frees the memory.
struct BlockPool::State {
  int count = 0;
  int64_t block_bytes = 0;
  Allocator allocator;
  std::string name;

  mutable std::mutex mu;
  std::condition_variable returned;
  std::vector<uint8_t*> free;  // guarded by mu
  bool closed = false;         // guarded by mu: the pool is gone, returned blocks are freed

  // Called by a block's deleter: back to the free list, or freed when the pool is gone.
  void Return(uint8_t* block) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!closed) {
        free.push_back(block);
        returned.notify_one();
        return;
      }
    }
    allocator.free(block);
  }
};

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::Create(int count, int64_t block_bytes,
                                                             Allocator allocator,
                                                             std::string name) {
  if (count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": block count must be >= 1, got ", count));
  }
  if (block_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": block size must be >= 1 byte, got ", block_bytes));
  }
  auto state = std::make_shared<State>();
  state->count = count;
  state->block_bytes = block_bytes;
  state->allocator = std::move(allocator);
  state->name = std::move(name);
  // From here on the pool owns what is allocated: its destructor frees the free list.
  std::unique_ptr<BlockPool> pool(new BlockPool(state));
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<uint8_t*> block = state->allocator.allocate(block_bytes);
    if (!block.ok()) return block.status();
    state->free.push_back(*block);
  }
  return pool;
}

BlockPool::~BlockPool() {
  std::vector<uint8_t*> free;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->closed = true;
    free.swap(state_->free);
  }
  for (uint8_t* block : free) state_->allocator.free(block);
}

absl::StatusOr<BlockPool::Block> BlockPool::Acquire(std::chrono::steady_clock::duration timeout) {
  uint8_t* block = nullptr;
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (!state_->returned.wait_for(lock, timeout, [this] { return !state_->free.empty(); })) {
      return absl::DeadlineExceededError(
          absl::StrCat("waited ", std::chrono::duration<double>(timeout).count(),
                       " s for a free block of ", state_->name, ": all ", state_->count,
                       " blocks of ", state_->block_bytes, " bytes are still held"));
    }
    block = state_->free.back();
    state_->free.pop_back();
  }
  return Block(block, [state = state_](uint8_t* returned) { state->Return(returned); });
}

int BlockPool::count() const { return state_->count; }

int64_t BlockPool::block_bytes() const { return state_->block_bytes; }

int BlockPool::free_count() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return static_cast<int>(state_->free.size());
}

}  // namespace dequantd
