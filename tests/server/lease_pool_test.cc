// Tests for LeasePool (server/backend/lease_pool.h): leases are exclusive, returned on destruction
// (also when moved), and callers beyond the pool's size wait rather than share an item.
#include "server/backend/lease_pool.h"

#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace dequantd {
namespace {

struct Item {
  int id = 0;
  std::atomic<int> users{0};
};

std::vector<std::unique_ptr<Item>> MakeItems(int n) {
  std::vector<std::unique_ptr<Item>> items;
  for (int i = 0; i < n; ++i) {
    items.push_back(std::make_unique<Item>());
    items.back()->id = i;
  }
  return items;
}

TEST(LeasePoolTest, LeasesAreDistinctAndReturned) {
  LeasePool<Item> pool(MakeItems(3));
  EXPECT_EQ(pool.size(), 3u);
  {
    auto a = pool.Acquire();
    auto b = pool.Acquire();
    auto c = pool.Acquire();
    EXPECT_EQ(pool.free_count(), 0u);
    EXPECT_EQ((std::set<int>{a->id, b->id, c->id}).size(), 3u);
    auto moved = std::move(a);  // the moved-from lease returns nothing
    EXPECT_EQ(pool.free_count(), 0u);
  }
  EXPECT_EQ(pool.free_count(), 3u);
}

TEST(LeasePoolTest, TryAcquireLendsAFreeItemOrNothing) {
  std::vector<std::unique_ptr<int>> items;
  items.push_back(std::make_unique<int>(7));
  LeasePool<int> pool(std::move(items));
  {
    std::optional<LeasePool<int>::Lease> lease = pool.TryAcquire();
    ASSERT_TRUE(lease.has_value());
    EXPECT_EQ(**lease, 7);
    EXPECT_EQ(pool.free_count(), 0u);
    EXPECT_FALSE(pool.TryAcquire().has_value());
  }
  EXPECT_EQ(pool.free_count(), 1u);
  EXPECT_TRUE(pool.TryAcquire().has_value());
}

TEST(LeasePoolTest, MoreCallersThanItemsNeverShareOne) {
  LeasePool<Item> pool(MakeItems(2));
  std::atomic<int> overlaps{0};
  std::atomic<int> max_in_use{0};
  std::atomic<int> in_use{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto lease = pool.Acquire();
        if (lease->users.fetch_add(1) != 0) ++overlaps;
        const int now = in_use.fetch_add(1) + 1;
        int seen = max_in_use.load();
        while (now > seen && !max_in_use.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::yield();
        in_use.fetch_sub(1);
        lease->users.fetch_sub(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_LE(max_in_use.load(), 2);
  EXPECT_EQ(pool.free_count(), 2u);
}

}  // namespace
}  // namespace dequantd
