// Tests for the CUDA backend's routing (server/backend/device_router.h) with fake workers: least
// loaded first, round robin on ties, failed workers out of rotation (listener once, UNAVAILABLE
// naming why), and DequantizeLayers parts (known answers worked by hand). No GPU.
#include "server/backend/device_router.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Recorder {
  std::map<int, int64_t> load;
  std::vector<std::pair<int, std::string>> failed;
  std::mutex mu;
};

DeviceRouter MakeRouter(Recorder& r, int n) {
  std::vector<std::string> labels;
  for (int i = 0; i < n; ++i) labels.push_back("cuda:" + std::to_string(i));
  return DeviceRouter(
      labels,
      [&r](int w, int64_t calls) {
        std::lock_guard<std::mutex> lock(r.mu);
        r.load[w] = calls;
      },
      [&r](int w, const std::string& why) {
        std::lock_guard<std::mutex> lock(r.mu);
        r.failed.emplace_back(w, why);
      });
}

TEST(DeviceRouterTest, OneWorkerTakesEveryCall) {
  Recorder r;
  DeviceRouter router = MakeRouter(r, 1);
  std::vector<DeviceRouter::Ticket> held;
  for (int i = 0; i < 5; ++i) held.push_back(*router.AcquireLeastLoaded({0}));
  for (const auto& t : held) EXPECT_EQ(t.worker(), 0);
  EXPECT_EQ(router.in_flight(0), 5);
  EXPECT_EQ(r.load[0], 5);
  held.clear();
  EXPECT_EQ(router.in_flight(0), 0);
  EXPECT_EQ(r.load[0], 0);
}

TEST(DeviceRouterTest, LeastLoadedWinsAndTiesRotate) {
  Recorder r;
  DeviceRouter router = MakeRouter(r, 3);
  const std::vector<int> all = {0, 1, 2};
  // Idle workers: ties, so consecutive calls rotate over all three.
  {
    std::vector<int> seen;
    for (int i = 0; i < 3; ++i) {
      DeviceRouter::Ticket t = *router.AcquireLeastLoaded(all);
      seen.push_back(t.worker());
    }  // each released before the next
    EXPECT_THAT(seen, ElementsAre(0, 1, 2));
  }
  // Worker 0 busy with 2 calls, worker 1 with 1: the next goes to 2, then 1 or 2 (tie at 1).
  DeviceRouter::Ticket a = router.Acquire(0);
  DeviceRouter::Ticket b = router.Acquire(0);
  DeviceRouter::Ticket c = router.Acquire(1);
  DeviceRouter::Ticket d = *router.AcquireLeastLoaded(all);
  EXPECT_EQ(d.worker(), 2);
  DeviceRouter::Ticket e = *router.AcquireLeastLoaded(all);
  EXPECT_NE(e.worker(), 0);
  EXPECT_THAT(router.loads(), testing::Contains(2));
  EXPECT_EQ(router.in_flight(0) + router.in_flight(1) + router.in_flight(2), 5);
}

TEST(DeviceRouterTest, OnlyCandidatesAreChosen) {
  Recorder r;
  DeviceRouter router = MakeRouter(r, 3);
  DeviceRouter::Ticket busy = router.Acquire(2);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(router.AcquireLeastLoaded({2})->worker(), 2);  // the client's device, though busy
  }
  absl::StatusOr<DeviceRouter::Ticket> none = router.AcquireLeastLoaded({});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
}

TEST(DeviceRouterTest, FailedWorkerLeavesRotationOnceAndOthersServe) {
  Recorder r;
  DeviceRouter router = MakeRouter(r, 2);
  EXPECT_TRUE(router.MarkFailed(1, "cudaErrorLaunchFailure"));
  EXPECT_FALSE(router.MarkFailed(1, "again"));
  ASSERT_EQ(r.failed.size(), 1u);
  EXPECT_EQ(r.failed[0].first, 1);
  EXPECT_EQ(r.failed[0].second, "cudaErrorLaunchFailure");
  EXPECT_FALSE(router.serving(1));
  EXPECT_EQ(router.failure(1), "cudaErrorLaunchFailure");
  EXPECT_TRUE(router.serving(0));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(router.AcquireLeastLoaded({0, 1})->worker(), 0);
  absl::StatusOr<DeviceRouter::Ticket> only_failed = router.AcquireLeastLoaded({1});
  ASSERT_FALSE(only_failed.ok());
  EXPECT_EQ(only_failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(only_failed.status().message(),
              HasSubstr("out of rotation (cuda:1: cudaErrorLaunchFailure)"));
}

TEST(DeviceRouterTest, ConcurrentCallsBalanceAndLoadReturnsToZero) {
  Recorder r;
  DeviceRouter router = MakeRouter(r, 2);
  std::vector<std::thread> threads;
  std::atomic<int> max_skew{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        DeviceRouter::Ticket ticket = *router.AcquireLeastLoaded({0, 1});
        const std::vector<int64_t> loads = router.loads();
        const int skew = static_cast<int>(std::abs(loads[0] - loads[1]));
        int seen = max_skew.load();
        while (skew > seen && !max_skew.compare_exchange_weak(seen, skew)) {
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(router.in_flight(0), 0);
  EXPECT_EQ(router.in_flight(1), 0);
  // Least-loaded choice keeps the two within the 8 concurrent callers of each other.
  EXPECT_LE(max_skew.load(), 8);
}

std::vector<std::tuple<size_t, size_t, int>> Parts(const std::vector<LayerPart>& parts) {
  std::vector<std::tuple<size_t, size_t, int>> out;
  for (const LayerPart& p : parts) out.emplace_back(p.begin, p.end, p.worker);
  return out;
}

TEST(PlanLayerPartsTest, SmallCallStaysOnTheLeastLoadedWorker) {
  const std::vector<std::vector<int>> cands(3, {0, 1});
  auto parts = PlanLayerParts(cands, {10, 10, 10}, {1, 0}, /*min_part_bytes=*/100);
  ASSERT_TRUE(parts.ok());
  EXPECT_THAT(Parts(*parts), ElementsAre(std::make_tuple(0, 3, 1)));
}

TEST(PlanLayerPartsTest, OneWorkerIsOnePart) {
  const std::vector<std::vector<int>> cands(4, {0});
  auto parts = PlanLayerParts(cands, {100, 100, 100, 100}, {0}, 1);
  ASSERT_TRUE(parts.ok());
  EXPECT_THAT(Parts(*parts), ElementsAre(std::make_tuple(0, 4, 0)));
}

TEST(PlanLayerPartsTest, LargeReplicatedCallIsSpreadByBytes) {
  // 400 bytes, min part 100, 2 candidates -> 2 parts. Midpoints 50, 150, 250, 350 -> 0, 0, 1, 1.
  const std::vector<std::vector<int>> cands(4, {0, 1});
  auto parts = PlanLayerParts(cands, {100, 100, 100, 100}, {0, 0}, 100);
  ASSERT_TRUE(parts.ok());
  EXPECT_THAT(Parts(*parts), ElementsAre(std::make_tuple(0, 2, 0), std::make_tuple(2, 4, 1)));
  // Worker 0 busier: it gets the second half (least loaded first).
  auto busy = PlanLayerParts(cands, {100, 100, 100, 100}, {3, 0}, 100);
  ASSERT_TRUE(busy.ok());
  EXPECT_THAT(Parts(*busy), ElementsAre(std::make_tuple(0, 2, 1), std::make_tuple(2, 4, 0)));
  // Three workers but bytes for two parts only (250 / 100 = 2).
  const std::vector<std::vector<int>> three(5, {0, 1, 2});
  auto two = PlanLayerParts(three, {50, 50, 50, 50, 50}, {0, 0, 0}, 100);
  ASSERT_TRUE(two.ok());
  // Midpoints 25, 75, 125, 175, 225 of 250, * 2 -> 0.2, 0.6, 1.0, 1.4, 1.8 -> 0, 0, 1, 1, 1.
  EXPECT_THAT(Parts(*two), ElementsAre(std::make_tuple(0, 2, 0), std::make_tuple(2, 5, 1)));
}

TEST(PlanLayerPartsTest, AFirstEntryLargerThanAPartMakesNoEmptyPart) {
  // One entry, two candidates: m = 2, its midpoint 50 of 100 * 2 = 1.0 -> part 1. Before the fix
  // an empty part [0, 0) on worker 0 came first (its worker ran nothing, not even the call's
  // Begin: the H200 run of ModelLimitedToHalfItsPackedSizeServesEveryLayerBitExact, split).
  const std::vector<std::vector<int>> two(1, {0, 1});
  auto one = PlanLayerParts(two, {100}, {0, 0}, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_THAT(Parts(*one), ElementsAre(std::make_tuple(0, 1, 1)));
  // 1000, 10, 10 over three: midpoints 500, 1005, 1015 of 1020, * 3 -> 1.47, 2.96, 2.99.
  const std::vector<std::vector<int>> three(3, {0, 1, 2});
  auto big_first = PlanLayerParts(three, {1000, 10, 10}, {0, 0, 0}, 1);
  ASSERT_TRUE(big_first.ok());
  EXPECT_THAT(Parts(*big_first), ElementsAre(std::make_tuple(0, 1, 1), std::make_tuple(1, 3, 2)));
}

TEST(PlanLayerPartsTest, SplitModelFollowsTheHolders) {
  // Layers on 0, 0, 1, 1, 0 (a split placement, asked out of order): runs by holder.
  const std::vector<std::vector<int>> cands = {{0}, {0}, {1}, {1}, {0}};
  auto parts = PlanLayerParts(cands, {1, 1, 1, 1, 1}, {0, 0}, 1000);
  ASSERT_TRUE(parts.ok());
  EXPECT_THAT(Parts(*parts), ElementsAre(std::make_tuple(0, 2, 0), std::make_tuple(2, 4, 1),
                                         std::make_tuple(4, 5, 0)));
}

TEST(PlanLayerPartsTest, BadInputIsInvalidArgument) {
  EXPECT_EQ(PlanLayerParts({{0}}, {1, 2}, {0}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanLayerParts({{}}, {1}, {0}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanLayerParts({{5}}, {1}, {0}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanLayerParts({{0}}, {1}, {0}, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dequantd
