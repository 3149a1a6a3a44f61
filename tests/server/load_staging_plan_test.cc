// PlanLoadStaging (server/model/load_staging_plan.h): a pinned staging never exceeds the bytes
// asked for (--load-staging-bytes, --read-staging-bytes), whatever the threads asked for, and
// keeps readers before buffers.
#include "server/model/load_staging_plan.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace dequantd {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(LoadStagingPlanTest, DefaultsAreEightThreadsOfFourEightMiBBuffers) {
  const LoadStagingPlan plan = PlanLoadStaging(8, 256 * kMiB);
  EXPECT_EQ(plan.threads, 8);
  EXPECT_EQ(plan.buffers, 4);
  EXPECT_EQ(plan.chunk_bytes, 8 * kMiB);
  EXPECT_EQ(plan.bytes(), 256 * kMiB);
}

TEST(LoadStagingPlanTest, ReadTensorsDefaultIsEightThreadsOfFourTwoMiBBuffers) {
  const LoadStagingPlan plan = PlanLoadStaging(8, 64 * kMiB);
  EXPECT_EQ(plan.threads, 8);
  EXPECT_EQ(plan.buffers, 4);
  EXPECT_EQ(plan.chunk_bytes, 2 * kMiB);
}

// Too little for every reader to have four buffers: two each, and every reader kept.
TEST(LoadStagingPlanTest, ReadersAreKeptBeforeBuffers) {
  LoadStagingPlan plan = PlanLoadStaging(8, 16 * kMiB);
  EXPECT_EQ(plan.threads, 8);
  EXPECT_EQ(plan.buffers, 2);
  EXPECT_EQ(plan.chunk_bytes, kMiB);
  plan = PlanLoadStaging(32, 64 * kMiB);
  EXPECT_EQ(plan.threads, 32);
  EXPECT_EQ(plan.buffers, 2);
  EXPECT_EQ(plan.chunk_bytes, kMiB);
  plan = PlanLoadStaging(4, 16 * kMiB);  // exactly 4 x 4 x 1 MiB
  EXPECT_EQ(plan.threads, 4);
  EXPECT_EQ(plan.buffers, 4);
  EXPECT_EQ(plan.chunk_bytes, kMiB);
}

TEST(LoadStagingPlanTest, TheLeastStagingIsOneThreadOfTwoOneMiBBuffers) {
  const LoadStagingPlan plan = PlanLoadStaging(8, 2 * kMiB);
  EXPECT_EQ(plan.threads, 1);
  EXPECT_EQ(plan.buffers, 2);
  EXPECT_EQ(plan.chunk_bytes, kMiB);
}

TEST(LoadStagingPlanTest, NeverMoreThanAskedForAndChunksOfAtLeastOneMiBAligned) {
  for (int threads : {1, 2, 3, 7, 8, 16, 64, 256}) {
    for (int64_t staging : {2 * kMiB, 3 * kMiB, 4 * kMiB, 5 * kMiB + 12345, 31 * kMiB, 256 * kMiB,
                            257 * kMiB - 1, int64_t{64} << 30}) {
      const LoadStagingPlan plan = PlanLoadStaging(threads, staging);
      SCOPED_TRACE(testing::Message() << threads << " threads, " << staging << " bytes");
      EXPECT_LE(plan.bytes(), staging);
      EXPECT_GE(plan.chunk_bytes, kMiB);
      EXPECT_EQ(plan.chunk_bytes % kLoadChunkAlign, 0);
      EXPECT_GE(plan.threads, 1);
      EXPECT_LE(plan.threads, threads);
      EXPECT_GE(plan.buffers, 2);
    }
  }
}

}  // namespace
}  // namespace dequantd
