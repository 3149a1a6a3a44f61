// Grouped dequantization (kernels/cuda/grouped_dequant.h): the layout checked against independent
// arithmetic on the CPU (no device needed), and every item of mixed lists against
// DequantizeReference bit for bit on the GPU, with sentinel-filled outputs and guard bytes between
// them (GPU tests skip without a device).
#include "kernels/awq_format.h"
#include "kernels/cuda/grouped_dequant.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dequant.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/kernels/test_util.h"

namespace dequantd::cuda::testing {
namespace {

// ---- Layout (CPU only: fake, aligned pointers that are never dereferenced) ---------------------

GroupedItem FakeItem(const QuantShape& shape, uintptr_t base = 0x10000) {
  GroupedItem item;
  item.in.shape = shape;
  item.in.tensors[awq::kQweight] = reinterpret_cast<const int32_t*>(base);
  item.in.tensors[awq::kQzeros] = reinterpret_cast<const int32_t*>(base + 0x100);
  item.in.tensors[awq::kScales] = reinterpret_cast<const void*>(base + 0x200);
  item.out = reinterpret_cast<void*>(base + 0x300);
  return item;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Checks every invariant of `layout` for `items` with arithmetic written here: each item's rows
// covered once, in order, by segments of whole groups; unit and block counts; contiguous blocks;
// every bucket pointing at the segment holding its first block.
void ExpectLayoutConsistent(const std::vector<GroupedItem>& items, DType out,
                            const GroupedOptions& options, const GroupedLayout& layout) {
  const int64_t lanes = out == DType::kF32 ? 2 : 1;
  int64_t block = 0;
  int64_t bytes = 0;
  size_t s = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const QuantShape& shape = items[i].in.shape;
    bytes += shape.bytes_moved(out);
    const int rows = shape.group_size % options.rows_per_thread == 0 ? options.rows_per_thread : 1;
    int64_t row = 0;
    while (row < shape.K) {
      ASSERT_LT(s, layout.segments.size()) << "item " << i;
      const GroupedSegment& seg = layout.segments[s++];
      EXPECT_EQ(seg.item, static_cast<int64_t>(i));
      EXPECT_EQ(seg.row_begin, row);
      EXPECT_GT(seg.row_end, seg.row_begin);
      EXPECT_EQ(seg.row_end % shape.group_size, 0);
      EXPECT_EQ(seg.rows_per_thread, rows);
      const int64_t units = (seg.row_end - seg.row_begin) / rows * (shape.N / 8) * lanes;
      EXPECT_EQ(seg.units, units);
      EXPECT_LT(seg.units, int64_t{1} << 31);
      EXPECT_EQ(seg.block_begin, block);
      EXPECT_EQ(seg.block_end,
                block + CeilDiv(units, int64_t{options.block_size} * options.units_per_thread));
      block = seg.block_end;
      row = seg.row_end;
    }
    EXPECT_EQ(row, shape.K);
  }
  EXPECT_EQ(s, layout.segments.size());
  EXPECT_EQ(layout.total_blocks, block);
  EXPECT_EQ(layout.bytes_moved, bytes);
  const int64_t bucket_blocks = int64_t{1} << layout.bucket_shift;
  ASSERT_EQ(static_cast<int64_t>(layout.bucket_first.size()), CeilDiv(block, bucket_blocks));
  EXPECT_LE(layout.bucket_first.size(), size_t{1} << 16);
  for (size_t j = 0; j < layout.bucket_first.size(); ++j) {
    const int64_t first_block = static_cast<int64_t>(j) * bucket_blocks;
    ASSERT_LT(layout.bucket_first[j], layout.segments.size());
    const GroupedSegment& seg = layout.segments[layout.bucket_first[j]];
    EXPECT_LE(seg.block_begin, first_block) << "bucket " << j;
    EXPECT_GT(seg.block_end, first_block) << "bucket " << j;
  }
}

// The shapes of the mixed lists: every N, K, G and scale dtype of the brief, K * N capped so the
// CPU reference stays quick (10944 x 4672 has its own test).
std::vector<QuantShape> MixedShapes() {
  const int64_t ns[] = {8, 1440, 4672, 576};
  const int64_t ks[] = {1, 64, 576, 1536, 10944};
  std::vector<QuantShape> shapes;
  int turn = 0;
  for (int64_t k : ks) {
    for (int64_t n : ns) {
      if (k * n > (int64_t{1} << 24)) continue;
      // Group sizes cycle through 32, 64, 128, K; those not dividing K are skipped to the next.
      const int64_t gs[] = {32, 64, 128, k};
      int64_t g = k;
      for (int t = 0; t < 4; ++t) {
        const int64_t candidate = gs[(turn + t) % 4];
        if (k % candidate == 0) {
          g = candidate;
          break;
        }
      }
      shapes.push_back({k, n, g, turn % 2 == 0 ? DType::kF16 : DType::kBF16});
      ++turn;
    }
  }
  return shapes;
}

TEST(GroupedLayoutTest, MixedShapesCoverBrief) {
  bool n_seen[4] = {}, g_seen[4] = {}, bf16 = false, f16 = false, k1 = false, k10944 = false;
  for (const QuantShape& s : MixedShapes()) {
    ASSERT_TRUE(ValidateShape(s, DType::kF16).ok());
    n_seen[0] |= s.N == 8, n_seen[1] |= s.N == 1440, n_seen[2] |= s.N == 4672,
        n_seen[3] |= s.N == 576;
    g_seen[0] |= s.group_size == 32, g_seen[1] |= s.group_size == 64,
        g_seen[2] |= s.group_size == 128, g_seen[3] |= s.group_size == s.K && s.K > 128;
    bf16 |= s.scale_dtype == DType::kBF16, f16 |= s.scale_dtype == DType::kF16;
    k1 |= s.K == 1, k10944 |= s.K == 10944;
  }
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(n_seen[i] && g_seen[i]) << i;
  EXPECT_TRUE(bf16 && f16 && k1 && k10944);
}

TEST(GroupedLayoutTest, EmptyList) {
  absl::StatusOr<GroupedLayout> layout = PlanGroupedLayout({}, DType::kF16, {});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_TRUE(layout->segments.empty());
  EXPECT_EQ(layout->total_blocks, 0);
  EXPECT_TRUE(layout->bucket_first.empty());
  EXPECT_EQ(layout->bytes_moved, 0);
}

TEST(GroupedLayoutTest, MixedListsEveryDtypeAndOption) {
  std::vector<GroupedItem> items;
  for (const QuantShape& s : MixedShapes()) items.push_back(FakeItem(s));
  for (DType out : {DType::kF16, DType::kBF16, DType::kF32}) {
    for (int block : {32, 128, 512}) {
      for (int rows : {1, 2, 4, 8, 16}) {
        for (int units : {1, 2, 4}) {
          const GroupedOptions o{
              .block_size = block, .rows_per_thread = rows, .units_per_thread = units};
          absl::StatusOr<GroupedLayout> layout = PlanGroupedLayout(items, out, o);
          ASSERT_TRUE(layout.ok()) << layout.status();
          ExpectLayoutConsistent(items, out, o, *layout);
        }
      }
    }
  }
}

// Hand-worked: 8 x 16 (G 8), fp16 out, rows 4, block 32: 2 row blocks x 2 words = 4 units, one
// block; then K = 1 (G 1) falls back to one row: 1 x 1 word = 1 unit, block 1. fp32 doubles units.
TEST(GroupedLayoutTest, HandWorkedSmallLayout) {
  const std::vector<GroupedItem> items = {FakeItem({8, 16, 8, DType::kF16}),
                                          FakeItem({1, 8, 1, DType::kBF16})};
  const GroupedOptions o{.block_size = 32, .rows_per_thread = 4, .units_per_thread = 1};
  absl::StatusOr<GroupedLayout> layout = PlanGroupedLayout(items, DType::kF32, o);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->segments.size(), 2u);
  EXPECT_EQ(layout->segments[0].rows_per_thread, 4);
  EXPECT_EQ(layout->segments[0].units, 8);  // 2 row blocks x 2 words x 2 lanes
  EXPECT_EQ(layout->segments[0].block_begin, 0);
  EXPECT_EQ(layout->segments[0].block_end, 1);
  EXPECT_EQ(layout->segments[1].rows_per_thread, 1);
  EXPECT_EQ(layout->segments[1].units, 2);
  EXPECT_EQ(layout->segments[1].block_begin, 1);
  EXPECT_EQ(layout->segments[1].block_end, 2);
  EXPECT_EQ(layout->total_blocks, 2);
  EXPECT_EQ(layout->bucket_shift, 5);
  EXPECT_EQ(layout->bucket_first, std::vector<uint32_t>({0}));
  // Bytes by hand (awq_format.h): item 0: qweight 8*2*4 = 64, qzeros 1*2*4 = 8, scales 1*16*2 = 32,
  // out 128*4 = 512 -> 616; item 1: qweight 4, qzeros 4, scales 16, out 32 -> 56.
  EXPECT_EQ(layout->bytes_moved, 616 + 56);
}

// An fp32 layer of 2^32 units (rows 2): 4096 groups of 2^20 units, 2047 groups per segment.
TEST(GroupedLayoutTest, SplitsAnItemOf2To32Units) {
  const std::vector<GroupedItem> items = {FakeItem({524288, 65536, 128, DType::kF16})};
  const GroupedOptions o{.block_size = 128, .rows_per_thread = 2, .units_per_thread = 1};
  absl::StatusOr<GroupedLayout> layout = PlanGroupedLayout(items, DType::kF32, o);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->segments.size(), 3u);
  EXPECT_EQ(layout->segments[0].row_end, 2047 * 128);
  EXPECT_EQ(layout->segments[1].row_begin, 2047 * 128);
  EXPECT_EQ(layout->segments[1].row_end, 2 * 2047 * 128);
  EXPECT_EQ(layout->segments[2].row_end, 524288);
  EXPECT_EQ(layout->segments[2].units, 2 * (int64_t{1} << 20));
  EXPECT_EQ(layout->total_blocks, (int64_t{1} << 32) / 128);
  EXPECT_EQ(layout->bucket_shift, 9);  // 2^25 blocks in at most 2^16 buckets
  ExpectLayoutConsistent(items, DType::kF32, o, *layout);
}

// (N, K) items: one segment each, one block per tile of 64 result rows x 512 bytes of K
// (kAwqNkTileK: 256 fp16/bf16 or 128 fp32 values), whatever the options; counts by hand.
TEST(GroupedLayoutTest, NkItemsOneBlockPerTile) {
  QuantShape a{4096, 1024, 128, DType::kBF16};  // 1024 / 64 = 16 bands
  QuantShape b{130, 24, 65, DType::kF16};       // 1 band (24 rows); K 130: 1 tile, fp32 2
  QuantShape c{8, 16, 8, DType::kF16};
  for (QuantShape* s : {&a, &b, &c}) s->orientation = Orientation::kNK;
  const std::vector<GroupedItem> items = {FakeItem(a), FakeItem(b), FakeItem(c)};
  struct Want {
    DType out;
    int64_t a_tiles;  // 16 bands x tiles along K
    int64_t b_tiles;
  };
  for (const Want& want : {Want{DType::kBF16, 16 * 16, 1}, Want{DType::kF16, 16 * 16, 1},
                           Want{DType::kF32, 16 * 32, 2}}) {
    for (const GroupedOptions& o :
         {GroupedOptions{}, GroupedOptions{.block_size = 32, .rows_per_thread = 1}}) {
      absl::StatusOr<GroupedLayout> layout = PlanGroupedLayout(items, want.out, o);
      ASSERT_TRUE(layout.ok()) << layout.status();
      EXPECT_EQ(layout->orientation, Orientation::kNK);
      ASSERT_EQ(layout->segments.size(), 3u);
      const int64_t total = want.a_tiles + want.b_tiles + 1;
      const int64_t ends[] = {want.a_tiles, want.a_tiles + want.b_tiles, total};
      int64_t begin = 0;
      for (size_t i = 0; i < 3; ++i) {
        const GroupedSegment& seg = layout->segments[i];
        EXPECT_EQ(seg.item, static_cast<int64_t>(i));
        EXPECT_EQ(seg.row_begin, 0);
        EXPECT_EQ(seg.row_end, items[i].in.shape.K);
        EXPECT_EQ(seg.block_begin, begin);
        EXPECT_EQ(seg.block_end, ends[i]);
        EXPECT_EQ(seg.units, ends[i] - begin);
        begin = ends[i];
      }
      EXPECT_EQ(layout->total_blocks, total);
      EXPECT_EQ(layout->bytes_moved,
                a.bytes_moved(want.out) + b.bytes_moved(want.out) + c.bytes_moved(want.out));
      ASSERT_EQ(layout->bucket_shift, 5);
      ASSERT_EQ(static_cast<int64_t>(layout->bucket_first.size()), CeilDiv(total, 32));
      for (size_t j = 0; j < layout->bucket_first.size(); ++j) {
        const int64_t first = static_cast<int64_t>(j) * 32;
        const GroupedSegment& seg = layout->segments[layout->bucket_first[j]];
        EXPECT_LE(seg.block_begin, first) << j;
        EXPECT_GT(seg.block_end, first) << j;
      }
    }
  }
}

TEST(GroupedLayoutTest, RefusesItemsOfTwoOrientations) {
  QuantShape nk{64, 16, 32, DType::kF16};
  nk.orientation = Orientation::kNK;
  const std::vector<GroupedItem> items = {FakeItem({64, 16, 32, DType::kF16}), FakeItem(nk)};
  absl::StatusOr<GroupedLayout> layout = PlanGroupedLayout(items, DType::kF16, {});
  ASSERT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(layout.status().message().find("item 1: orientation nk differs from item 0's kn"),
            std::string::npos)
      << layout.status();
  EXPECT_EQ(GroupedPlan::Create(items, DType::kF16).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GroupedLayoutTest, RefusesGridOf2To31Blocks) {
  // 2^32 units in blocks of 32 units: 2^27 blocks per item; 16 items reach 2^31.
  const std::vector<GroupedItem> items(16, FakeItem({524288, 65536, 128, DType::kF16}));
  const GroupedOptions o{.block_size = 32, .rows_per_thread = 2, .units_per_thread = 1};
  absl::StatusOr<GroupedLayout> layout = PlanGroupedLayout(items, DType::kF32, o);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<GroupedItem> fewer(items.begin(), items.begin() + 15);
  EXPECT_TRUE(PlanGroupedLayout(fewer, DType::kF32, o).ok());
}

TEST(GroupedLayoutTest, RejectsBadItemsNamingThem) {
  const QuantShape good{64, 16, 32, DType::kF16};
  const auto expect_bad = [&](const GroupedItem& bad, DType out, const std::string& needle) {
    const std::vector<GroupedItem> items = {FakeItem(good), bad};
    absl::StatusOr<GroupedLayout> layout = PlanGroupedLayout(items, out, {});
    ASSERT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(layout.status().message().find("item 1: "), std::string::npos) << layout.status();
    EXPECT_NE(layout.status().message().find(needle), std::string::npos) << layout.status();
    // The launchers validate before touching the device (these run without a GPU).
    EXPECT_EQ(LaunchGroupedDequantize(items, out, nullptr).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(GroupedPlan::Create(items, out).status().code(), absl::StatusCode::kInvalidArgument);
  };
  expect_bad(FakeItem({64, 12, 32, DType::kF16}), DType::kF16, "N");
  expect_bad(FakeItem({64, 16, 48, DType::kF16}), DType::kF16, "group_size");
  expect_bad(FakeItem({64, 16, 32, DType::kF32}), DType::kF16, "scales");
  GroupedItem item = FakeItem(good);
  item.in.tensors[awq::kQzeros] = nullptr;
  expect_bad(item, DType::kF16, "non-null");
  item = FakeItem(good);
  item.out = static_cast<char*>(item.out) + 8;
  expect_bad(item, DType::kF16, "16-byte");
  item = FakeItem(good);
  item.in.tensors[awq::kScales] = static_cast<const char*>(awq::Scales(item.in)) + 4;
  expect_bad(item, DType::kF16, "16-byte");
  item = FakeItem(good);
  item.in.tensors[awq::kQweight] =
      reinterpret_cast<const int32_t*>(reinterpret_cast<uintptr_t>(awq::Qweight(item.in)) + 2);
  expect_bad(item, DType::kF16, "4-byte");
  // An int32 output is no output dtype of the dequantizer.
  const std::vector<GroupedItem> one = {FakeItem(good)};
  EXPECT_EQ(PlanGroupedLayout(one, DType::kI32, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GroupedLayoutTest, RejectsBadOptions) {
  const std::vector<GroupedItem> items = {FakeItem({64, 16, 32, DType::kF16})};
  for (const GroupedOptions& o :
       {GroupedOptions{.block_size = 100}, GroupedOptions{.block_size = 0},
        GroupedOptions{.block_size = 1024}, GroupedOptions{.rows_per_thread = 3},
        GroupedOptions{.rows_per_thread = 32}, GroupedOptions{.units_per_thread = 3},
        GroupedOptions{.units_per_thread = 0}}) {
    EXPECT_EQ(PlanGroupedLayout(items, DType::kF16, o).status().code(),
              absl::StatusCode::kInvalidArgument)
        << o.block_size << " " << o.rows_per_thread << " " << o.units_per_thread;
  }
}

// No items: nothing is allocated or launched, so this holds without a device; a moved-from plan
// refuses to launch.
TEST(GroupedLayoutTest, EmptyPlanAndMovedFromPlan) {
  absl::StatusOr<GroupedPlan> plan = GroupedPlan::Create({}, DType::kBF16);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->Launch(nullptr).ok());
  EXPECT_TRUE(LaunchGroupedDequantize({}, DType::kF32, nullptr).ok());
  GroupedPlan moved = *std::move(plan);
  EXPECT_TRUE(moved.Launch(nullptr).ok());
  EXPECT_EQ(plan->Launch(nullptr).code(), absl::StatusCode::kFailedPrecondition);  // NOLINT
}

// ---- GPU: every item against the reference ------------------------------------------------------

constexpr uint8_t kSentinel = 0xFF;   // a NaN pattern; finite scales never give NaN
constexpr int64_t kGuardBytes = 256;  // between outputs: must stay kSentinel

// Random layers on the device, their references per output dtype, and one output arena with
// guard bytes around every item's output.
class GroupedCase {
 public:
  GroupedCase(const std::vector<QuantShape>& shapes, uint64_t seed) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      host_.push_back(RandomLayer(shapes[i], seed + i));
      device_.push_back(std::make_unique<DeviceLayer>(host_.back()));
    }
  }

  bool ok() const {
    for (const auto& d : device_)
      if (!d->ok()) return false;
    return true;
  }

  // Allocates the arena for `out`, sentinel-filled, and returns the items pointing into it.
  std::vector<GroupedItem> Items(DType out) {
    offsets_.clear();
    int64_t at = kGuardBytes;
    for (const HostLayer& h : host_) {
      offsets_.push_back(at);
      at += (h.shape.output_bytes(out) + 255) / 256 * 256 + kGuardBytes;
    }
    arena_ = std::make_unique<DeviceBuffer>(static_cast<size_t>(at));
    std::vector<GroupedItem> items;
    if (!arena_->ok()) return items;
    for (size_t i = 0; i < host_.size(); ++i)
      items.push_back({device_[i]->view(), static_cast<char*>(arena_->get()) + offsets_[i]});
    return items;
  }

  void FillSentinel() {
    ASSERT_EQ(cudaMemset(arena_->get(), kSentinel, arena_->bytes()), cudaSuccess);
  }

  // Waits for the device, then compares every item's output with DequantizeReference and every
  // other byte of the arena with the sentinel.
  void ExpectMatchesReference(DType out, const std::string& what) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    std::vector<uint8_t> got(arena_->bytes());
    ASSERT_EQ(cudaMemcpy(got.data(), arena_->get(), got.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    std::vector<bool> covered(got.size(), false);
    for (size_t i = 0; i < host_.size(); ++i) {
      const QuantShape& s = host_[i].shape;
      const std::vector<uint8_t>& want = Reference(i, out);
      const uint8_t* item = got.data() + offsets_[i];
      EXPECT_EQ(std::memcmp(item, want.data(), want.size()), 0)
          << what << ": item " << i << " (" << s.K << "x" << s.N << " G" << s.group_size << " "
          << DTypeName(s.scale_dtype) << " scales, " << DTypeName(out) << " out)";
      std::fill(covered.begin() + offsets_[i], covered.begin() + offsets_[i] + want.size(), true);
    }
    int64_t stray = 0;
    for (size_t b = 0; b < got.size(); ++b) stray += !covered[b] && got[b] != kSentinel;
    EXPECT_EQ(stray, 0) << what << ": bytes written outside the items' outputs";
  }

 private:
  const std::vector<uint8_t>& Reference(size_t i, DType out) {
    const auto key = std::make_pair(i, out);
    for (auto& [k, v] : refs_)
      if (k == key) return v;
    const QuantShape& s = host_[i].shape;
    std::vector<uint8_t> want(static_cast<size_t>(s.output_bytes(out)));
    // The reference's row range is over the result's rows: K of (K, N), N of (N, K).
    const int64_t rows = s.orientation == Orientation::kNK ? s.N : s.K;
    const absl::Status st = DequantizeReference(host_[i].view(), out, 0, rows, want.data());
    EXPECT_TRUE(st.ok()) << st;
    refs_.emplace_back(key, std::move(want));
    return refs_.back().second;
  }

  std::vector<HostLayer> host_;
  std::vector<std::unique_ptr<DeviceLayer>> device_;
  std::vector<std::pair<std::pair<size_t, DType>, std::vector<uint8_t>>> refs_;
  std::unique_ptr<DeviceBuffer> arena_;
  std::vector<int64_t> offsets_;
};

// A plan launched twice (the second time into a fresh sentinel fill) and the one-shot call.
void RunAllWays(GroupedCase& c, DType out, const GroupedOptions& options, const std::string& what) {
  const std::vector<GroupedItem> items = c.Items(out);
  ASSERT_FALSE(items.empty()) << "arena allocation failed";
  absl::StatusOr<GroupedPlan> plan = GroupedPlan::Create(items, out, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int launch = 0; launch < 2; ++launch) {
    c.FillSentinel();
    const absl::Status st = plan->Launch(nullptr);
    ASSERT_TRUE(st.ok()) << st;
    c.ExpectMatchesReference(out, what + " plan launch " + std::to_string(launch));
  }
  c.FillSentinel();
  const absl::Status st = LaunchGroupedDequantize(items, out, nullptr, options);
  ASSERT_TRUE(st.ok()) << st;
  c.ExpectMatchesReference(out, what + " one-shot");
}

TEST(GroupedDequantTest, MixedListEveryOutputDtype) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  GroupedCase c(MixedShapes(), 1000);
  ASSERT_TRUE(c.ok());
  for (DType out : {DType::kF16, DType::kBF16, DType::kF32})
    RunAllWays(c, out, GroupedOptions{}, std::string(DTypeName(out)));
}

TEST(GroupedDequantTest, MixedListEveryLaunchOption) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  GroupedCase c(MixedShapes(), 2000);
  ASSERT_TRUE(c.ok());
  for (DType out : {DType::kF16, DType::kF32}) {
    for (const GroupedOptions& o :
         {GroupedOptions{.block_size = 96, .rows_per_thread = 1, .units_per_thread = 1},
          GroupedOptions{.block_size = 32, .rows_per_thread = 2, .units_per_thread = 4},
          GroupedOptions{.block_size = 256, .rows_per_thread = 8, .units_per_thread = 2},
          GroupedOptions{.block_size = 512, .rows_per_thread = 16, .units_per_thread = 4},
          GroupedOptions{.block_size = 128,
          .rows_per_thread = 4,
          .units_per_thread = 1,
          .programmatic_launch = false}}) {
      RunAllWays(c, out, o,
                 std::string(DTypeName(out)) + " block " + std::to_string(o.block_size) + " rows " +
                     std::to_string(o.rows_per_thread) + " units " +
                     std::to_string(o.units_per_thread));
    }
  }
}

// The same layer twice in one list (equal inputs, two outputs), then reversed order.
TEST(GroupedDequantTest, RepeatedAndReorderedItems) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  std::vector<QuantShape> shapes = MixedShapes();
  std::vector<QuantShape> list = {shapes[3], shapes[3]};
  list.insert(list.end(), shapes.rbegin(), shapes.rend());
  GroupedCase c(list, 3000);
  ASSERT_TRUE(c.ok());
  RunAllWays(c, DType::kBF16, GroupedOptions{}, "reordered");
}

TEST(GroupedDequantTest, OneHugeishItem) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  GroupedCase c({{10944, 4672, 64, DType::kBF16}}, 4000);
  ASSERT_TRUE(c.ok());
  RunAllWays(c, DType::kF32, GroupedOptions{}, "10944x4672 fp32");
  RunAllWays(c, DType::kF16, GroupedOptions{.rows_per_thread = 16}, "10944x4672 fp16 rows 16");
}

// (N, K) results: the brief's shapes plus odd ones (K not a multiple of a chunk: element stores;
// group sizes 65 and 12: each element with its own row's group), every output dtype, with and
// without programmatic launch.
TEST(GroupedDequantTest, NkMixedListEveryOutputDtype) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  std::vector<QuantShape> shapes = MixedShapes();
  shapes.push_back({130, 24, 65, DType::kBF16});
  shapes.push_back({36, 40, 12, DType::kF16});
  shapes.push_back({4096, 1024, 128, DType::kF16});
  for (QuantShape& s : shapes) s.orientation = Orientation::kNK;
  GroupedCase c(shapes, 5000);
  ASSERT_TRUE(c.ok());
  for (DType out : {DType::kF16, DType::kBF16, DType::kF32}) {
    RunAllWays(c, out, GroupedOptions{}, std::string("nk ") + std::string(DTypeName(out)));
    RunAllWays(c, out, GroupedOptions{.programmatic_launch = false},
               std::string("nk no pdl ") + std::string(DTypeName(out)));
  }
}

TEST(GroupedDequantTest, EmptyListOnDevice) {
  DEQUANTD_SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  absl::StatusOr<GroupedPlan> plan = GroupedPlan::Create({}, DType::kF16);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->Launch(stream).ok());
  EXPECT_TRUE(LaunchGroupedDequantize({}, DType::kF16, stream).ok());
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace dequantd::cuda::testing
