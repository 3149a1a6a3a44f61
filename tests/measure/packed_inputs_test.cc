#include "measure/packed_inputs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "gtest/gtest.h"
#include "kernels/awq_format.h"
#include "kernels/mxfp4_format.h"

namespace dequantd::bench {
namespace {

// The little-endian elements of `bytes`.
template <class T>
std::vector<T> Elements(const std::vector<uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

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
  EXPECT_EQ(full->tensors, plain.tensors);
}

TEST(MakeRandomPackedTensorTest, ScalesFiniteNonZeroAndWordsFullRange_K256N512G128) {
  for (DType scale_dtype : {DType::kF16, DType::kBF16}) {
    const QuantShape shape{256, 512, 128, scale_dtype};
    const HostPackedTensor t = MakeRandomPackedTensor(shape, 7);
    const std::vector<uint32_t> qweight = Elements<uint32_t>(t.tensors[awq::kQweight]);
    const std::vector<uint16_t> scales = Elements<uint16_t>(t.tensors[awq::kScales]);
    ASSERT_EQ(qweight.size(), 256u * 64);
    ASSERT_EQ(t.tensors[awq::kQzeros].size(), 2u * 64 * 4);
    ASSERT_EQ(scales.size(), 2u * 512);
    for (uint16_t bits : scales) {
      const float s = scale_dtype == DType::kF16 ? HalfBitsToFloat(bits) : Bf16BitsToFloat(bits);
      ASSERT_TRUE(std::isfinite(s)) << bits;
      ASSERT_GE(std::fabs(s), 6.103515625e-05f) << bits;  // 2^-14
      ASSERT_LT(std::fabs(s), 2.0f) << bits;
    }
    // Every nibble value appears in every nibble position of qweight.
    for (int j = 0; j < 8; ++j) {
      std::set<uint32_t> seen;
      for (uint32_t w : qweight) seen.insert((w >> (4 * j)) & 0xF);
      EXPECT_EQ(seen.size(), 16u) << "nibble " << j;
    }
    // Both signs of scale occur.
    int negative = 0;
    for (uint16_t bits : scales) negative += (bits >> 15) & 1;
    EXPECT_GT(negative, 0);
    EXPECT_LT(negative, static_cast<int>(scales.size()));
  }
}

TEST(MakeRandomPackedTensorTest, SeedDeterminesInputs) {
  const QuantShape shape{128, 64, 128, DType::kF16};
  const HostPackedTensor a = MakeRandomPackedTensor(shape, 1);
  const HostPackedTensor b = MakeRandomPackedTensor(shape, 1);
  const HostPackedTensor c = MakeRandomPackedTensor(shape, 2);
  EXPECT_EQ(a.tensors, b.tensors);
  EXPECT_NE(a.tensors[awq::kQweight], c.tensors[awq::kQweight]);
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

// MXFP4 inputs: every role by its dtype (bytes: blocks and E8M0 scales, 0xFF included), sized as
// the stored tensors; the checker's rows are the stacked result's (E*K rows of N for KN).
TEST(MakeRandomPackedTensorTest, Mxfp4RolesAreRandomBytesAndRowsStackExperts_E3K64N40) {
  const QuantShape shape = mxfp4::MakeShape(64, 40, 3);
  const HostPackedTensor t = MakeRandomPackedTensor(shape, 9);
  ASSERT_EQ(t.tensors[mxfp4::kBlocks].size(), 3u * 40 * 32);
  ASSERT_EQ(t.tensors[mxfp4::kScales].size(), 3u * 40 * 2);
  std::set<uint8_t> seen(t.tensors[mxfp4::kBlocks].begin(), t.tensors[mxfp4::kBlocks].end());
  EXPECT_EQ(seen.size(), 256u);
  absl::StatusOr<OutputChecker> checker = OutputChecker::Create(t.view(), DType::kBF16, 1 << 20);
  ASSERT_TRUE(checker.ok()) << checker.status();
  std::mt19937_64 rng(0);
  EXPECT_EQ(checker->PickRows(rng, 8), (std::vector<RowRange>{{0, 3 * 64}}));
  EXPECT_EQ(checker->row_bytes(), 40 * 2);
  std::vector<uint16_t> out(3 * 64 * 40);
  ASSERT_TRUE(DequantizeReference(t.view(), DType::kBF16, 0, 3 * 64, out.data()).ok());
  EXPECT_TRUE(Matched(checker->Matches({0, 3 * 64}, out.data())));
}

// Formats whose stored values have rules (GPTQ's g_idx) are refused, not fed random bytes.
TEST(MakeRandomPackedTensorTest, FormatsWithStoredValueRulesAreInvalidArgument) {
  QuantShape shape{128, 64, 32, DType::kF16};
  shape.format = Format::kGptq;
  const absl::StatusOr<HostPackedTensor> t = MakeRandomPackedTensor(shape, 1, nullptr);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("format gptq"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace dequantd::bench
