// Tests for BlockPool (server/backend/block_pool.h) with an injected malloc allocator: blocks are
// distinct and of the asked size; a block goes back to the pool only when its last handle goes; a
// waiter is woken by a release on another thread; a pool whose blocks are all held fails Acquire
// with DEADLINE_EXCEEDED naming it; blocks outlive the pool and are freed by their last release;
// creation errors free what was allocated; concurrent users never share a block.
#include "server/backend/block_pool.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

using ::testing::HasSubstr;

// malloc/free, counted. Outlives every pool and block of a test (held by shared_ptr in the
// allocator's functions, as the real pinned allocator is process-wide).
struct Counts {
  std::atomic<int> allocated{0};
  std::atomic<int> freed{0};
  int fail_at = -1;  // the allocation (0-based) that fails, -1: none
};

BlockPool::Allocator CountingAllocator(const std::shared_ptr<Counts>& counts) {
  return BlockPool::Allocator{
      .allocate = [counts](int64_t bytes) -> absl::StatusOr<uint8_t*> {
        if (counts->allocated.load() == counts->fail_at) {
          return absl::ResourceExhaustedError("injected: no memory");
        }
        ++counts->allocated;
        return static_cast<uint8_t*>(std::malloc(static_cast<size_t>(bytes)));
      },
      .free =
          [counts](uint8_t* block) {
            ++counts->freed;
            std::free(block);
          },
  };
}

std::unique_ptr<BlockPool> MakePool(int count, int64_t bytes,
                                    const std::shared_ptr<Counts>& counts) {
  absl::StatusOr<std::unique_ptr<BlockPool>> pool =
      BlockPool::Create(count, bytes, CountingAllocator(counts), "the test blocks");
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

constexpr auto kNoWait = std::chrono::steady_clock::duration::zero();
constexpr auto kLongWait = std::chrono::seconds(60);

TEST(BlockPoolTest, BadCountOrSizeIsInvalidArgument) {
  auto counts = std::make_shared<Counts>();
  for (auto [count, bytes] : {std::pair{0, int64_t{16}}, std::pair{-1, int64_t{16}},
                              std::pair{2, int64_t{0}}, std::pair{2, int64_t{-4}}}) {
    absl::StatusOr<std::unique_ptr<BlockPool>> pool =
        BlockPool::Create(count, bytes, CountingAllocator(counts), "the test blocks");
    ASSERT_FALSE(pool.ok());
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(pool.status().message()), HasSubstr("the test blocks"));
  }
  EXPECT_EQ(counts->allocated.load(), 0);
}

TEST(BlockPoolTest, AllocatorErrorIsReturnedAndFreesTheBlocksBeforeIt) {
  auto counts = std::make_shared<Counts>();
  counts->fail_at = 2;
  absl::StatusOr<std::unique_ptr<BlockPool>> pool =
      BlockPool::Create(4, 64, CountingAllocator(counts), "the test blocks");
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(counts->allocated.load(), 2);
  EXPECT_EQ(counts->freed.load(), 2);
}

TEST(BlockPoolTest, BlocksAreDistinctAndReturnWithTheirLastHandle) {
  auto counts = std::make_shared<Counts>();
  std::unique_ptr<BlockPool> pool = MakePool(3, 4096, counts);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->count(), 3);
  EXPECT_EQ(pool->block_bytes(), 4096);
  EXPECT_EQ(pool->free_count(), 3);
  absl::StatusOr<BlockPool::Block> a = pool->Acquire(kNoWait);
  absl::StatusOr<BlockPool::Block> b = pool->Acquire(kNoWait);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->get(), b->get());
  std::memset(a->get(), 1, 4096);  // the whole block is usable
  std::memset(b->get(), 2, 4096);
  EXPECT_EQ(pool->free_count(), 1);

  // Copies (as a sink keeps them: the type-erased keepalive of ChunkSink::WriteShared) hold it.
  std::shared_ptr<const void> keepalive = *a;
  std::shared_ptr<const void> second = keepalive;
  a->reset();
  EXPECT_EQ(pool->free_count(), 1);
  keepalive.reset();
  EXPECT_EQ(pool->free_count(), 1);
  second.reset();  // the last one
  EXPECT_EQ(pool->free_count(), 2);
  b->reset();
  EXPECT_EQ(pool->free_count(), 3);
  EXPECT_EQ(counts->freed.load(), 0);  // returned to the pool, not freed
  pool.reset();
  EXPECT_EQ(counts->freed.load(), 3);
}

TEST(BlockPoolTest, AllBlocksHeldIsDeadlineExceededNamingThePool) {
  auto counts = std::make_shared<Counts>();
  std::unique_ptr<BlockPool> pool = MakePool(2, 1 << 20, counts);
  ASSERT_NE(pool, nullptr);
  absl::StatusOr<BlockPool::Block> a = pool->Acquire(kNoWait);
  absl::StatusOr<BlockPool::Block> b = pool->Acquire(kNoWait);
  ASSERT_TRUE(a.ok() && b.ok());
  for (auto timeout :
       {kNoWait, std::chrono::steady_clock::duration(std::chrono::milliseconds(20))}) {
    absl::StatusOr<BlockPool::Block> c = pool->Acquire(timeout);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(c.status().message()),
                HasSubstr("for a free block of the test blocks: all 2 blocks of 1048576 bytes are "
                          "still held"));
  }
  // Once one comes back, the next Acquire gets exactly that one.
  uint8_t* const returned = a->get();
  a->reset();
  absl::StatusOr<BlockPool::Block> c = pool->Acquire(kNoWait);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->get(), returned);
}

TEST(BlockPoolTest, AReleaseOnAnotherThreadWakesTheWaiter) {
  auto counts = std::make_shared<Counts>();
  std::unique_ptr<BlockPool> pool = MakePool(1, 64, counts);
  ASSERT_NE(pool, nullptr);
  absl::StatusOr<BlockPool::Block> held = pool->Acquire(kNoWait);
  ASSERT_TRUE(held.ok());
  uint8_t* const block = held->get();
  std::thread releaser([held = std::move(*held)]() mutable { held.reset(); });
  absl::StatusOr<BlockPool::Block> got = pool->Acquire(kLongWait);  // waits unless already back
  releaser.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->get(), block);
}

TEST(BlockPoolTest, BlocksOutliveThePoolAndAreFreedByTheirLastRelease) {
  auto counts = std::make_shared<Counts>();
  std::unique_ptr<BlockPool> pool = MakePool(4, 256, counts);
  ASSERT_NE(pool, nullptr);
  absl::StatusOr<BlockPool::Block> a = pool->Acquire(kNoWait);
  absl::StatusOr<BlockPool::Block> b = pool->Acquire(kNoWait);
  ASSERT_TRUE(a.ok() && b.ok());
  std::memset(a->get(), 0x5a, 256);
  std::shared_ptr<const void> kept = *b;  // e.g. a gRPC slice's keepalive
  b->reset();
  pool.reset();                        // the slot is gone; gRPC still holds two blocks
  EXPECT_EQ(counts->freed.load(), 2);  // the two free ones, now
  for (int i = 0; i < 256; ++i) ASSERT_EQ(a->get()[i], 0x5a);  // still valid
  a->reset();
  EXPECT_EQ(counts->freed.load(), 3);
  std::thread([kept = std::move(kept)]() mutable { kept.reset(); }).join();  // a gRPC thread
  EXPECT_EQ(counts->freed.load(), 4);
  EXPECT_EQ(counts->allocated.load(), 4);
}

TEST(BlockPoolTest, ConcurrentUsersNeverShareABlock) {
  auto counts = std::make_shared<Counts>();
  std::unique_ptr<BlockPool> pool = MakePool(3, sizeof(std::atomic<int>), counts);
  ASSERT_NE(pool, nullptr);
  // Each block holds a user count, zeroed here.
  {
    std::vector<BlockPool::Block> all;
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<BlockPool::Block> block = pool->Acquire(kNoWait);
      ASSERT_TRUE(block.ok());
      new (block->get()) std::atomic<int>(0);
      all.push_back(std::move(*block));
    }
  }
  std::atomic<int> overlaps{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        absl::StatusOr<BlockPool::Block> block = pool->Acquire(kLongWait);
        if (!block.ok()) {
          ++failures;
          continue;
        }
        auto* users = reinterpret_cast<std::atomic<int>*>(block->get());
        if (users->fetch_add(1) != 0) ++overlaps;
        std::this_thread::yield();
        users->fetch_sub(1);
        // Half the time the last reference goes on another copy's thread, as gRPC's would.
        if (i % 2 == 0) {
          std::thread([b = std::move(*block)]() mutable { b.reset(); }).join();
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(pool->free_count(), 3);
}

}  // namespace
}  // namespace dequantd
