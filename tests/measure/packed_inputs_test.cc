#include "measure/packed_inputs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/awq_format.h"
#include "kernels/format_registry.h"
#include "kernels/gptq_format.h"
#include "kernels/mxfp4_format.h"
#include "measure/benchmark.h"

namespace dequantd::bench {
namespace {

// A layer the generator made (its status checked).
HostPackedTensor Random(const QuantShape& shape, uint64_t seed) {
  absl::StatusOr<HostPackedTensor> t = MakeRandomPackedTensor(shape, seed);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : HostPackedTensor{};
}

// Role r's int32 words / 16-bit values.
std::vector<int32_t> Words(const HostPackedTensor& t, int role) {
  std::vector<int32_t> w(static_cast<size_t>(t.role_bytes(role) / 4));
  std::memcpy(w.data(), t.tensors[static_cast<size_t>(role)].data(), w.size() * 4);
  return w;
}
std::vector<uint16_t> Halves(const HostPackedTensor& t, int role) {
  std::vector<uint16_t> h(static_cast<size_t>(t.role_bytes(role) / 2));
  std::memcpy(h.data(), t.tensors[static_cast<size_t>(role)].data(), h.size() * 2);
  return h;
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
  // Each role: 1 before allocating, then 1 per started 4 MiB: qweight 1 + 2 blocks; qzeros
  // (32 x 512 words) 1 + 1; scales (32 x 4096 halves) 1 + 1.
  EXPECT_EQ(polls, 7);
  const HostPackedTensor plain = Random(shape, 5);
  EXPECT_EQ(full->tensors, plain.tensors);
}

TEST(MakeRandomPackedTensorTest, ScalesFiniteNonZeroAndWordsFullRange_K256N512G128) {
  for (DType scale_dtype : {DType::kF16, DType::kBF16}) {
    const QuantShape shape{256, 512, 128, scale_dtype};
    const HostPackedTensor t = Random(shape, 7);
    const std::vector<int32_t> qweight = Words(t, awq::kQweight);
    const std::vector<uint16_t> scales = Halves(t, awq::kScales);
    ASSERT_EQ(qweight.size(), 256u * 64);
    ASSERT_EQ(Words(t, awq::kQzeros).size(), 2u * 64);
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
      for (int32_t w : qweight) seen.insert((static_cast<uint32_t>(w) >> (4 * j)) & 0xF);
      EXPECT_EQ(seen.size(), 16u) << "nibble " << j;
    }
    // Both signs of scale occur.
    int negative = 0;
    for (uint16_t bits : scales) negative += (bits >> 15) & 1;
    EXPECT_GT(negative, 0);
    EXPECT_LT(negative, static_cast<int>(scales.size()));
  }
}

// MXFP4's E8M0 scales span exactly 113..127 (2^-14 .. 2^0, every exponent of the band seen),
// and its blocks every byte (both nibbles of every E2M1 code, signs included).
TEST(MakeRandomPackedTensorTest, Mxfp4ScalesInTheQuantizersBandBlocksEveryByte_E2K256N128) {
  const QuantShape shape = mxfp4::MakeShape(256, 128, 2);
  const HostPackedTensor t = Random(shape, 13);
  ASSERT_EQ(t.role_bytes(mxfp4::kScales), 2 * 128 * 256 / 32);
  const auto* scales = reinterpret_cast<const uint8_t*>(t.tensors[mxfp4::kScales].data());
  std::set<int> seen_scales(scales, scales + t.role_bytes(mxfp4::kScales));
  EXPECT_EQ(*seen_scales.begin(), 113);
  EXPECT_EQ(*seen_scales.rbegin(), 127);
  EXPECT_EQ(seen_scales.size(), 15u);
  const auto* blocks = reinterpret_cast<const uint8_t*>(t.tensors[mxfp4::kBlocks].data());
  const std::set<int> seen_bytes(blocks, blocks + t.role_bytes(mxfp4::kBlocks));
  EXPECT_EQ(seen_bytes.size(), 256u);
}

// Every format's preset layer (measure/benchmark.h PresetShape) is generated with its stored
// tensors' sizes, passes the format's stored-value rules, and its g_idx (GPTQ act-order) gives
// every group exactly G rows; the checker's rows follow the orientation.
TEST(MakeRandomPackedTensorTest, EveryFormatsPresetLayer_K256N128G64) {
  for (const FormatRow& row : FormatRows()) {
    SCOPED_TRACE(std::string(row.name));
    const QuantShape shape = ToQuantShape(PresetShape(row.format, 256, 128, 64));
    ASSERT_TRUE(ValidateShape(shape, DType::kBF16).ok()) << ValidateShape(shape, DType::kBF16);
    const HostPackedTensor t = Random(shape, 11);
    int64_t bytes = 0;
    for (int r = 0; r < row.role_count; ++r) {
      EXPECT_EQ(t.role_bytes(r), RoleAbsent(shape, r) ? 0 : TensorSpecOf(shape, r).bytes());
      EXPECT_GE(static_cast<int64_t>(t.tensors[static_cast<size_t>(r)].size()) * 4,
                t.role_bytes(r));
      bytes += t.role_bytes(r);
      if (t.role_bytes(r) > 0 && std::string_view(row.roles[static_cast<size_t>(r)]) == "g_idx") {
        std::vector<int> rows_of_group(static_cast<size_t>(shape.groups()), 0);
        for (int32_t g : Words(t, r)) {
          ASSERT_GE(g, 0);
          ASSERT_LT(g, shape.groups());
          ++rows_of_group[static_cast<size_t>(g)];
        }
        for (int n : rows_of_group) EXPECT_EQ(n, shape.group_size);
      }
    }
    EXPECT_EQ(bytes, shape.packed_bytes());
    absl::StatusOr<OutputChecker> checker = OutputChecker::Create(t.view(), DType::kBF16, 1 << 20);
    ASSERT_TRUE(checker.ok()) << checker.status();
    std::mt19937_64 rng(0);
    EXPECT_EQ(checker->PickRows(rng, 8), (std::vector<RowRange>{{0, shape.result_rows()}}));
    EXPECT_EQ(checker->row_bytes(), shape.result_cols() * 2);
    std::vector<uint8_t> out(static_cast<size_t>(shape.output_bytes(DType::kBF16)));
    ASSERT_TRUE(DequantizeCpu(t.view(), DType::kBF16, 0, shape.result_rows(), out.data(), 2).ok());
    EXPECT_TRUE(Matched(checker->Matches({0, shape.result_rows()}, out.data())));
    out[out.size() / 2] ^= 1;
    EXPECT_FALSE(Matched(checker->Matches({0, shape.result_rows()}, out.data())));
  }
}

TEST(MakeRandomPackedTensorTest, RandomValuesThatBreakAFormatsRuleAreRefused) {
  // GPTQ declared symmetric: every zero must be 2^(bits-1); uniform random zeros are not.
  QuantShape shape = ToQuantShape(PresetShape(Format::kGptq, 256, 128, 64));
  shape.format_flags |= gptq::kSym;
  const absl::StatusOr<HostPackedTensor> t = MakeRandomPackedTensor(shape, 1);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("random gptq inputs do not meet"), std::string::npos)
      << t.status();
}

TEST(MakeRandomPackedTensorTest, SeedDeterminesInputs) {
  const QuantShape shape{128, 64, 128, DType::kF16};
  const HostPackedTensor a = Random(shape, 1);
  const HostPackedTensor b = Random(shape, 1);
  const HostPackedTensor c = Random(shape, 2);
  EXPECT_EQ(a.tensors, b.tensors);
  EXPECT_NE(Words(a, awq::kQweight), Words(c, awq::kQweight));
}

TEST(OutputCheckerTest, FullCheckFindsOneFlippedBit_K256N64G128Fp16) {
  const QuantShape shape{256, 64, 128, DType::kF16};
  const HostPackedTensor t = Random(shape, 3);
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
  const HostPackedTensor t = Random(shape, 4);
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
