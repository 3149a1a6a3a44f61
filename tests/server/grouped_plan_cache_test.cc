// GroupedPlanCache (server/backend/cuda/grouped_plan_cache.h), on a GPU (skipped without one): the
// same items and dtype give the kept plan; another output address, dtype or options a new one; the
// least recently used plan gives way at capacity. Plans are built from fake, aligned pointers and
// never launched here (the backend test RepeatedLayersIntoDeviceMemoryAreBitExactEveryTime
// launches kept plans and checks every byte).
#if DEQUANTD_HAVE_CUDA

#include "server/backend/cuda/grouped_plan_cache.h"
#include "kernels/awq_format.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "server/backend/cuda/cuda_backend.h"

namespace dequantd::cuda {
namespace {

std::vector<GroupedItem> FakeItems(uintptr_t out_base) {
  std::vector<GroupedItem> items;
  for (int i = 0; i < 3; ++i) {
    GroupedItem item;
    item.in.shape = {.K = 256, .N = 128 * (i + 1), .group_size = 128};
    const uintptr_t in_base = 0x100000 * static_cast<uintptr_t>(i + 1);
    item.in.tensors[awq::kQweight] = reinterpret_cast<const int32_t*>(in_base);
    item.in.tensors[awq::kQzeros] = reinterpret_cast<const int32_t*>(in_base + 0x10000);
    item.in.tensors[awq::kScales] = reinterpret_cast<const void*>(in_base + 0x20000);
    item.out = reinterpret_cast<void*>(out_base + 0x100000 * static_cast<uintptr_t>(i));
    items.push_back(item);
  }
  return items;
}

class GroupedPlanCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  std::shared_ptr<const GroupedPlan> Get(GroupedPlanCache& cache, uintptr_t out, DType dtype,
                                         const GroupedOptions& options = {}) {
    absl::StatusOr<std::shared_ptr<const GroupedPlan>> plan =
        cache.Get(FakeItems(out), dtype, options, stream_);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : nullptr;
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(GroupedPlanCacheTest, SameItemsGiveTheKeptPlanAndAnyDifferenceANewOne) {
  GroupedPlanCache cache(8);
  const auto first = Get(cache, 0x10000000, DType::kF16);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->layout().segments.size(), 3u);
  EXPECT_EQ(Get(cache, 0x10000000, DType::kF16), first);
  EXPECT_EQ(cache.size(), 1u);

  const auto moved = Get(cache, 0x20000000, DType::kF16);  // another destination address
  const auto fp32 = Get(cache, 0x10000000, DType::kF32);
  GroupedOptions other;
  other.rows_per_thread = 4;
  const auto rows4 = Get(cache, 0x10000000, DType::kF16, other);
  for (const auto& plan : {moved, fp32, rows4}) {
    ASSERT_NE(plan, nullptr);
    EXPECT_NE(plan, first);
  }
  EXPECT_EQ(fp32->out_dtype(), DType::kF32);
  EXPECT_EQ(rows4->options().rows_per_thread, 4);
  EXPECT_EQ(cache.size(), 4u);
  // A shorter list with the same first items is not the same call.
  absl::StatusOr<std::shared_ptr<const GroupedPlan>> prefix =
      cache.Get(absl::MakeConstSpan(FakeItems(0x10000000)).subspan(0, 2), DType::kF16, {}, stream_);
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  EXPECT_NE(*prefix, first);
  EXPECT_EQ((*prefix)->layout().segments.size(), 2u);
}

TEST_F(GroupedPlanCacheTest, TheLeastRecentlyUsedPlanGivesWayAtCapacity) {
  GroupedPlanCache cache(2);
  const auto a = Get(cache, 0x10000000, DType::kF16);
  const auto b = Get(cache, 0x20000000, DType::kF16);
  EXPECT_EQ(Get(cache, 0x10000000, DType::kF16), a);   // a is now the most recent
  const auto c = Get(cache, 0x30000000, DType::kF16);  // b gives way
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(Get(cache, 0x10000000, DType::kF16), a);
  EXPECT_EQ(Get(cache, 0x30000000, DType::kF16), c);
  const auto b_again = Get(cache, 0x20000000, DType::kF16);
  ASSERT_NE(b_again, nullptr);
  EXPECT_NE(b_again, b);  // built anew; the old one lives on while held
  EXPECT_EQ(b->layout().segments.size(), 3u);
}

TEST_F(GroupedPlanCacheTest, AnInvalidListIsInvalidArgumentAndKeptNowhere) {
  GroupedPlanCache cache(2);
  std::vector<GroupedItem> items = FakeItems(0x10000000);
  items[1].in.shape.N = 100;  // not a multiple of 8
  absl::StatusOr<std::shared_ptr<const GroupedPlan>> plan =
      cache.Get(items, DType::kF16, {}, stream_);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace dequantd::cuda

#endif  // DEQUANTD_HAVE_CUDA
