// PlanDeviceBlocks (server/model/device_blocks.h): layers packed in order into few device blocks,
// each aligned, none overlapping, no block over its bound unless it holds one layer.
#include "server/model/device_blocks.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace dequantd {
namespace {

constexpr int64_t kAlign = 256;

// Checks the plan's guarantees for `sizes` and returns it.
DeviceBlockPlan CheckedPlan(const std::vector<int64_t>& sizes, int64_t block_bytes) {
  const DeviceBlockPlan plan = PlanDeviceBlocks(sizes, block_bytes, kAlign);
  EXPECT_EQ(plan.block.size(), sizes.size());
  EXPECT_EQ(plan.offset.size(), sizes.size());
  std::vector<int> held_in(plan.block_bytes.size(), 0);
  int64_t end_in_block = 0;
  int last_block = -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) {
      EXPECT_EQ(plan.block[i], -1) << i;
      continue;
    }
    const int b = plan.block[i];
    EXPECT_GE(b, last_block) << i << ": in order";
    EXPECT_LT(b, static_cast<int>(plan.block_bytes.size())) << i;
    EXPECT_EQ(plan.offset[i] % kAlign, 0) << i;
    if (b == last_block) {
      EXPECT_GE(plan.offset[i], end_in_block) << i << ": overlaps";
    }
    EXPECT_LE(plan.offset[i] + sizes[i], plan.block_bytes[static_cast<size_t>(b)]) << i;
    end_in_block = plan.offset[i] + sizes[i];
    last_block = b;
    ++held_in[static_cast<size_t>(b)];
  }
  for (size_t b = 0; b < plan.block_bytes.size(); ++b) {
    EXPECT_GE(held_in[b], 1) << "block " << b << " holds nothing";
    if (held_in[b] > 1) {
      EXPECT_LE(plan.block_bytes[b], block_bytes) << "block " << b;
    }
  }
  return plan;
}

TEST(DeviceBlocksTest, ConsecutiveLayersShareBlocksUpToTheBound) {
  // 10 layers of 1000 bytes at 1024-byte strides: 4 fit in 4100 (1024 x 3 + 1000 = 4072).
  const DeviceBlockPlan plan = CheckedPlan(std::vector<int64_t>(10, 1000), 4100);
  EXPECT_EQ(plan.block_bytes, (std::vector<int64_t>{4072, 4072, 2024}));
  EXPECT_EQ(plan.offset[1], 1024);
  EXPECT_EQ(plan.block[4], 1);
  EXPECT_EQ(plan.offset[4], 0);
}

TEST(DeviceBlocksTest, ALayerOverTheBoundHasABlockOfItsOwn) {
  const DeviceBlockPlan plan = CheckedPlan({100, 5000, 100, 100}, 1000);
  EXPECT_EQ(plan.block_bytes, (std::vector<int64_t>{100, 5000, 356}));
  EXPECT_EQ(plan.block[1], 1);
  EXPECT_EQ(plan.block[2], 2);
  EXPECT_EQ(plan.offset[3], 256);
}

TEST(DeviceBlocksTest, LayersNotHeldTakeNoMemory) {
  const DeviceBlockPlan plan = CheckedPlan({0, 300, 0, 0, 300, 0}, int64_t{2} << 30);
  EXPECT_EQ(plan.block_bytes, (std::vector<int64_t>{812}));
  EXPECT_EQ(plan.offset[4], 512);
  EXPECT_TRUE(PlanDeviceBlocks({0, 0}, 1000, kAlign).block_bytes.empty());
  EXPECT_TRUE(PlanDeviceBlocks({}, 1000, kAlign).block_bytes.empty());
}

TEST(DeviceBlocksTest, A70BShapedModelTakesSeventeenAllocationsInsteadOf560) {
  // 80 blocks x 7 projections of Llama-3-70B, AWQ G=128 (qweight + qzeros + scales, bytes).
  const auto awq = [](int64_t k, int64_t n) {
    return k * n / 2 + (k / 128) * (n / 2) + (k / 128) * n * 2 + 512;
  };
  std::vector<int64_t> sizes;
  for (int block = 0; block < 80; ++block) {
    for (const auto& [k, n] : std::vector<std::pair<int64_t, int64_t>>{{8192, 8192},
                                                                       {8192, 1024},
                                                                       {8192, 1024},
                                                                       {8192, 8192},
                                                                       {8192, 28672},
                                                                       {8192, 28672},
                                                                       {28672, 8192}}) {
      sizes.push_back(awq(k, n));
    }
  }
  const DeviceBlockPlan plan = CheckedPlan(sizes, int64_t{2} << 30);
  EXPECT_EQ(plan.block_bytes.size(), 17u);
}

}  // namespace
}  // namespace dequantd
