// Tests for the result pipeline's arithmetic (server/backend/result_slabs.h): range resolution with
// the field named on errors, slab cutting (bound, duplicates, oversized results) and piece sizes.
#include "server/backend/result_slabs.h"

#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ResolveRangeTest, DefaultIsTheWholeResult) {
  absl::StatusOr<ByteRange> r = ResolveRange({}, 1000);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->begin, 0);
  EXPECT_EQ(r->end, 1000);
}

TEST(ResolveRangeTest, OffsetAndLength) {
  absl::StatusOr<ByteRange> r = ResolveRange({.offset = 96, .length = 200}, 1000);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->begin, 96);
  EXPECT_EQ(r->size(), 200);
  r = ResolveRange({.offset = 900, .length = -1}, 1000);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 100);
  r = ResolveRange({.offset = 1000, .length = 0}, 1000);  // empty, at the end
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 0);
}

TEST(ResolveRangeTest, OutOfBoundsNamesTheField) {
  absl::Status s = ResolveRange({.offset = -2, .length = -1}, 1000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("offset"));
  s = ResolveRange({.offset = 1001, .length = -1}, 1000).status();
  EXPECT_THAT(s.message(), HasSubstr("offset"));
  s = ResolveRange({.offset = 10, .length = 991}, 1000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("length"));
  s = ResolveRange({.offset = 0, .length = -5}, 1000).status();
  EXPECT_THAT(s.message(), HasSubstr("length"));
}

TEST(PlanSlabsTest, CutsAtTheBoundAndAlignsOffsets) {
  // Results of 100, 300, 50, 600 bytes, aligned to 256 -> 256, 512, 256, 768; bound 1024.
  const std::vector<SlabEntry> entries = {
      {.result = 0, .result_bytes = 100},
      {.result = 1, .result_bytes = 300},
      {.result = 2, .result_bytes = 50},
      {.result = 3, .result_bytes = 600},
  };
  const std::vector<Slab> slabs = PlanSlabs(entries, 1024, 256);
  ASSERT_EQ(slabs.size(), 2u);
  EXPECT_EQ(slabs[0].first, 0u);
  EXPECT_EQ(slabs[0].end, 3u);
  EXPECT_EQ(slabs[0].bytes, 1024);
  EXPECT_THAT(slabs[0].offsets, ElementsAre(0, 256, 768));
  EXPECT_THAT(slabs[0].distinct, ElementsAre(0u, 1u, 2u));
  EXPECT_EQ(slabs[1].first, 3u);
  EXPECT_EQ(slabs[1].end, 4u);
  EXPECT_EQ(slabs[1].bytes, 768);
  EXPECT_THAT(slabs[1].offsets, ElementsAre(0));
}

TEST(PlanSlabsTest, DuplicatesShareTheirResultInsideASlabOnly) {
  const std::vector<SlabEntry> entries = {
      {.result = 7, .result_bytes = 256}, {.result = 9, .result_bytes = 256},
      {.result = 7, .result_bytes = 256},  // same slab: shares offset 0
      {.result = 5, .result_bytes = 512},  // starts slab 2 (256 * 2 + 512 > 768)
      {.result = 7, .result_bytes = 256},  // slab 2 has no 7 yet: computed again there
  };
  const std::vector<Slab> slabs = PlanSlabs(entries, 768, 256);
  ASSERT_EQ(slabs.size(), 2u);
  EXPECT_THAT(slabs[0].offsets, ElementsAre(0, 256, 0));
  EXPECT_THAT(slabs[0].distinct, ElementsAre(0u, 1u));
  EXPECT_EQ(slabs[0].bytes, 512);
  EXPECT_THAT(slabs[1].offsets, ElementsAre(0, 512));
  EXPECT_THAT(slabs[1].distinct, ElementsAre(3u, 4u));
  EXPECT_EQ(slabs[1].bytes, 768);
}

TEST(PlanSlabsTest, AResultLargerThanTheBoundGetsItsOwnSlab) {
  const std::vector<SlabEntry> entries = {{.result = 0, .result_bytes = 10},
                                          {.result = 1, .result_bytes = 5000},
                                          {.result = 2, .result_bytes = 10}};
  const std::vector<Slab> slabs = PlanSlabs(entries, 1000, 16);
  ASSERT_EQ(slabs.size(), 3u);
  EXPECT_EQ(slabs[0].bytes, 16);
  EXPECT_EQ(slabs[1].bytes, 5008);
  EXPECT_EQ(slabs[2].bytes, 16);
  for (const Slab& slab : slabs) EXPECT_EQ(slab.end - slab.first, 1u);
}

TEST(PlanSlabsTest, StagedInputsAreCutAtTheirOwnBoundAndCountedOncePerSlab) {
  // A whole-model launch straight into a destination (result bound unlimited) with staged
  // inputs (0: resident): staged 300, 0, 500 (800), then 400 would be 1200 > 1000: new slab;
  // 400, 300 (700), a duplicate of result 4 adds nothing, 2000 alone: a slab of its own.
  const std::vector<SlabEntry> entries = {
      {.result = 0, .result_bytes = 64, .staged_bytes = 300},
      {.result = 1, .result_bytes = 64, .staged_bytes = 0},
      {.result = 2, .result_bytes = 64, .staged_bytes = 500},
      {.result = 3, .result_bytes = 64, .staged_bytes = 400},
      {.result = 4, .result_bytes = 64, .staged_bytes = 300},
      {.result = 4, .result_bytes = 64, .staged_bytes = 300},
      {.result = 5, .result_bytes = 64, .staged_bytes = 2000},
      {.result = 6, .result_bytes = 64, .staged_bytes = 0},
  };
  const std::vector<Slab> slabs =
      PlanSlabs(entries, std::numeric_limits<int64_t>::max(), 64, /*staged_limit=*/1000);
  ASSERT_EQ(slabs.size(), 3u);
  EXPECT_EQ(slabs[0].first, 0u);
  EXPECT_EQ(slabs[0].end, 3u);
  EXPECT_EQ(slabs[0].staged_bytes, 800);
  EXPECT_EQ(slabs[1].first, 3u);
  EXPECT_EQ(slabs[1].end, 6u);
  EXPECT_EQ(slabs[1].staged_bytes, 700);
  EXPECT_THAT(slabs[1].distinct, ElementsAre(3u, 4u));
  EXPECT_THAT(slabs[1].offsets, ElementsAre(0, 64, 64));
  // The oversized input gets its slab; the resident layer after it joins it (adds no staging).
  EXPECT_EQ(slabs[2].first, 6u);
  EXPECT_EQ(slabs[2].end, 8u);
  EXPECT_EQ(slabs[2].staged_bytes, 2000);
  // Without staged inputs the default bound changes nothing: one slab.
  std::vector<SlabEntry> resident = entries;
  for (SlabEntry& e : resident) e.staged_bytes = 0;
  EXPECT_EQ(PlanSlabs(resident, std::numeric_limits<int64_t>::max(), 64, 1000).size(), 1u);
}

TEST(PlanSlabsTest, EveryEntryLandsInExactlyOneSlabWithinTheBound) {
  // 224 layers shaped like a Llama-3-8B's seven projections, fp16: no slab above the bound
  // except single oversized results, entries in order, none lost.
  const int64_t sizes[] = {4096 * 4096 * 2,  4096 * 1024 * 2,  4096 * 1024 * 2, 4096 * 4096 * 2,
                           4096 * 14336 * 2, 4096 * 14336 * 2, 14336 * 4096 * 2};
  std::vector<SlabEntry> entries;
  for (int64_t i = 0; i < 224; ++i) entries.push_back({.result = i, .result_bytes = sizes[i % 7]});
  const int64_t bound = int64_t{256} << 20;
  const std::vector<Slab> slabs = PlanSlabs(entries, bound, 256);
  size_t next = 0;
  int64_t total = 0;
  for (const Slab& slab : slabs) {
    EXPECT_EQ(slab.first, next);
    EXPECT_GT(slab.end, slab.first);
    EXPECT_LE(slab.bytes, bound);
    next = slab.end;
    total += slab.bytes;
  }
  EXPECT_EQ(next, entries.size());
  int64_t expected = 0;
  for (int64_t i = 0; i < 224; ++i) expected += sizes[i % 7];
  EXPECT_EQ(total, expected);  // every size here is a multiple of 256
  EXPECT_TRUE(PlanSlabs({}, bound, 256).empty());
}

TEST(PieceBytesTest, WholeChunksWhenAChunkFits) {
  EXPECT_EQ(PieceBytes(4 << 20, 1 << 20), 4 << 20);
  EXPECT_EQ(PieceBytes(4 << 20, 3 << 20), 3 << 20);
  EXPECT_EQ(PieceBytes(1000, 300), 900);
  EXPECT_EQ(PieceBytes(1 << 20, 3 << 20), 1 << 20);  // chunk larger than the buffer
}

}  // namespace
}  // namespace dequantd
