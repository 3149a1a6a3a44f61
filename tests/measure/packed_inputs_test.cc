#include "measure/packed_inputs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "gtest/gtest.h"

namespace dequantd::bench {
namespace {

// Whether the check ran and matched.
bool Matched(const absl::StatusOr<bool>& r) {
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() && *r;
}

TEST(MakeRandomPackedTensorTest, CancelledIsPolledInsideTheGenerationLoop) {
  // K = 4096, N = 4096: qweight 4096 * 512 words = 8 MiB, two 4 MiB blocks. Polls: before
  // allocating qweight (1), before its first block (2), before its second block (3).
  const QuantShape shape{4096, 4096, 128, DType::kF16};
  int polls = 0;
  const absl::StatusOr<HostPackedTensor> t =
      MakeRandomPackedTensor(shape, 5, [&polls] { return ++polls == 3; });
  EXPECT_EQ(t.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(t.status().message(), "benchmark cancelled");
  EXPECT_EQ(polls, 3);  // stopped in the middle of qweight, not polled again
  // Never firing: the same inputs as the uncancellable overload draws.
  polls = 0;
  const absl::StatusOr<HostPackedTensor> full =
      MakeRandomPackedTensor(shape, 5, [&polls] { return ++polls < 0; });
  ASSERT_TRUE(full.ok()) << full.status();
  // qweight: 1 + 2 blocks; qzeros (32 x 512 words): 1 + 1; scales (32 x 4096 = 131072 < 2 Mi
  // halves): 1 before allocating.
  EXPECT_EQ(polls, 6);
  const HostPackedTensor plain = MakeRandomPackedTensor(shape, 5);
  EXPECT_EQ(full->qweight, plain.qweight);
  EXPECT_EQ(full->qzeros, plain.qzeros);
  EXPECT_EQ(full->scales, plain.scales);
}

TEST(MakeRandomPackedTensorTest, ScalesFiniteNonZeroAndWordsFullRange_K256N512G128) {
  for (DType scale_dtype : {DType::kF16, DType::kBF16}) {
    const QuantShape shape{256, 512, 128, scale_dtype};
    const HostPackedTensor t = MakeRandomPackedTensor(shape, 7);
    ASSERT_EQ(t.qweight.size(), 256u * 64);
    ASSERT_EQ(t.qzeros.size(), 2u * 64);
    ASSERT_EQ(t.scales.size(), 2u * 512);
    for (uint16_t bits : t.scales) {
      const float s = scale_dtype == DType::kF16 ? HalfBitsToFloat(bits) : Bf16BitsToFloat(bits);
      ASSERT_TRUE(std::isfinite(s)) << bits;
      ASSERT_GE(std::fabs(s), 6.103515625e-05f) << bits;  // 2^-14
      ASSERT_LT(std::fabs(s), 2.0f) << bits;
    }
    // Every nibble value appears in every nibble position of qweight.
    for (int j = 0; j < 8; ++j) {
      std::set<uint32_t> seen;
      for (int32_t w : t.qweight) seen.insert((static_cast<uint32_t>(w) >> (4 * j)) & 0xF);
      EXPECT_EQ(seen.size(), 16u) << "nibble " << j;
    }
    // Both signs of scale occur.
    int negative = 0;
    for (uint16_t bits : t.scales) negative += (bits >> 15) & 1;
    EXPECT_GT(negative, 0);
    EXPECT_LT(negative, static_cast<int>(t.scales.size()));
  }
}

TEST(MakeRandomPackedTensorTest, SeedDeterminesInputs) {
  const QuantShape shape{128, 64, 128, DType::kF16};
  const HostPackedTensor a = MakeRandomPackedTensor(shape, 1);
  const HostPackedTensor b = MakeRandomPackedTensor(shape, 1);
  const HostPackedTensor c = MakeRandomPackedTensor(shape, 2);
  EXPECT_EQ(a.qweight, b.qweight);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_NE(a.qweight, c.qweight);
}

TEST(OutputCheckerTest, FullCheckFindsOneFlippedBit_K256N64G128Fp16) {
  const QuantShape shape{256, 64, 128, DType::kF16};
  const HostPackedTensor t = MakeRandomPackedTensor(shape, 3);
  absl::StatusOr<OutputChecker> checker = OutputChecker::Create(t.view(), DType::kF16, 1 << 20);
  ASSERT_TRUE(checker.ok()) << checker.status();
  EXPECT_TRUE(checker->full());
  std::mt19937_64 rng(0);
  const std::vector<RowRange> rows = checker->PickRows(rng, 8);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0], (RowRange{0, 256}));

  std::vector<uint16_t> out(256 * 64);
  ASSERT_TRUE(DequantizeReference(t.view(), DType::kF16, 0, 256, out.data()).ok());
  EXPECT_TRUE(Matched(checker->Matches(rows[0], out.data())));
  out[200 * 64 + 5] ^= 1;
  EXPECT_FALSE(Matched(checker->Matches(rows[0], out.data())));
}

TEST(OutputCheckerTest, SampledRowsIncludeFirstAndLast_K1024N64G128Bf16) {
  const QuantShape shape{1024, 64, 128, DType::kF16};
  const HostPackedTensor t = MakeRandomPackedTensor(shape, 4);
  absl::StatusOr<OutputChecker> checker = OutputChecker::Create(t.view(), DType::kBF16, 1000);
  ASSERT_TRUE(checker.ok()) << checker.status();
  EXPECT_FALSE(checker->full());
  std::mt19937_64 rng(5);
  const std::vector<RowRange> rows = checker->PickRows(rng, 8);
  ASSERT_GE(rows.size(), 3u);
  ASSERT_LE(rows.size(), 10u);
  EXPECT_EQ(rows.front(), (RowRange{0, 1}));
  EXPECT_EQ(rows.back(), (RowRange{1023, 1024}));
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_LT(rows[i - 1].first, rows[i].first);

  std::vector<uint16_t> out(1024 * 64);
  ASSERT_TRUE(DequantizeReference(t.view(), DType::kBF16, 0, 1024, out.data()).ok());
  for (const RowRange& r : rows) {
    EXPECT_TRUE(Matched(checker->Matches(r, out.data() + r.first * 64))) << r.first;
  }
  std::vector<uint16_t> wrong(out.begin() + 1023 * 64, out.end());
  wrong[63] ^= 0x8000;
  EXPECT_FALSE(Matched(checker->Matches({1023, 1024}, wrong.data())));
  EXPECT_EQ(checker->Matches({1024, 1025}, wrong.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dequantd::bench
