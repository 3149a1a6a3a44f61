#include "measure/packed_inputs.h"

#include <algorithm>
#include <cstring>

#include "measure/method.h"

namespace dequantd::bench {
namespace {

// splitmix64: a fast, well-mixed 64-bit generator (Steele, Lea, Flood 2014).
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Fills `words` with SplitMix64 output (two words per draw), polling `cancelled` every
// kCancelPollBytes.
absl::Status FillWords(std::vector<int32_t>& words, uint64_t& state,
                       const std::function<bool()>& cancelled) {
  constexpr size_t kPollWords = kCancelPollBytes / sizeof(int32_t);  // even
  for (size_t block = 0; block < words.size(); block += kPollWords) {
    if (absl::Status c = CheckCancelled(cancelled); !c.ok()) return c;
    const size_t end = std::min(words.size(), block + kPollWords);
    size_t i = block;
    for (; i + 1 < end; i += 2) {
      const uint64_t r = SplitMix64(state);
      words[i] = static_cast<int32_t>(static_cast<uint32_t>(r));
      words[i + 1] = static_cast<int32_t>(static_cast<uint32_t>(r >> 32));
    }
    if (i < end) words[i] = static_cast<int32_t>(static_cast<uint32_t>(SplitMix64(state)));
  }
  return absl::OkStatus();
}

// A random finite, non-zero value in [2^-14, 2) with a random sign, as fp16 or bf16 bits.
uint16_t RandomScaleBits(DType dtype, uint64_t r) {
  const uint32_t sign = static_cast<uint32_t>(r & 1);
  const uint32_t exp_offset = static_cast<uint32_t>((r >> 1) % 15);  // 2^-14 .. 2^0
  const uint32_t mant = static_cast<uint32_t>(r >> 8);
  if (dtype == DType::kBF16) {
    return static_cast<uint16_t>((sign << 15) | ((127 - 14 + exp_offset) << 7) | (mant & 0x7F));
  }
  return static_cast<uint16_t>((sign << 15) | ((15 - 14 + exp_offset) << 10) | (mant & 0x3FF));
}

}  // namespace

HostPackedTensor MakeRandomPackedTensor(const QuantShape& shape, uint64_t seed) {
  return *MakeRandomPackedTensor(shape, seed, nullptr);  // never cancelled: always a value
}

absl::StatusOr<HostPackedTensor> MakeRandomPackedTensor(const QuantShape& shape, uint64_t seed,
                                                        const std::function<bool()>& cancelled) {
  HostPackedTensor t;
  t.shape = shape;
  uint64_t state = seed;
  if (absl::Status c = CheckCancelled(cancelled); !c.ok()) return c;
  t.qweight.resize(static_cast<size_t>(awq::QweightElements(shape)));
  if (absl::Status s = FillWords(t.qweight, state, cancelled); !s.ok()) return s;
  if (absl::Status c = CheckCancelled(cancelled); !c.ok()) return c;
  t.qzeros.resize(static_cast<size_t>(awq::QzerosElements(shape)));
  if (absl::Status s = FillWords(t.qzeros, state, cancelled); !s.ok()) return s;
  if (absl::Status c = CheckCancelled(cancelled); !c.ok()) return c;
  t.scales.resize(static_cast<size_t>(awq::ScalesElements(shape)));
  constexpr size_t kPollScales = kCancelPollBytes / sizeof(uint16_t);
  for (size_t i = 0; i < t.scales.size(); ++i) {
    if (i % kPollScales == kPollScales - 1) {
      if (absl::Status c = CheckCancelled(cancelled); !c.ok()) return c;
    }
    t.scales[i] = RandomScaleBits(shape.scale_dtype, SplitMix64(state));
  }
  return t;
}

absl::StatusOr<OutputChecker> OutputChecker::Create(const QuantView& in, DType out_dtype,
                                                    int64_t full_check_max_elements) {
  OutputChecker checker(in, out_dtype);
  checker.full_ = in.shape.output_elements() <= full_check_max_elements;
  if (checker.full_) {
    checker.expected_.resize(static_cast<size_t>(in.shape.output_bytes(out_dtype)));
    if (absl::Status s =
            DequantizeReference(in, out_dtype, 0, in.shape.K, checker.expected_.data());
        !s.ok()) {
      return s;
    }
  } else if (absl::Status s = ValidateShape(in.shape, out_dtype); !s.ok()) {
    return s;
  }
  return checker;
}

std::vector<RowRange> OutputChecker::PickRows(std::mt19937_64& rng, int sampled_rows) const {
  const int64_t K = in_.shape.K;
  if (full_) return {{0, K}};
  std::vector<int64_t> rows = {0, K - 1};
  std::uniform_int_distribution<int64_t> row(0, K - 1);
  for (int i = 0; i < sampled_rows; ++i) rows.push_back(row(rng));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::vector<RowRange> ranges;
  for (int64_t r : rows) ranges.emplace_back(r, r + 1);
  return ranges;
}

absl::StatusOr<bool> OutputChecker::Matches(RowRange range, const void* data) const {
  const auto [begin, end] = range;
  if (begin < 0 || end > in_.shape.K || begin >= end) {
    return absl::InvalidArgumentError("row range outside the output");
  }
  const size_t bytes = static_cast<size_t>((end - begin) * row_bytes());
  if (full_) {
    return std::memcmp(expected_.data() + begin * row_bytes(), data, bytes) == 0;
  }
  std::vector<uint8_t> expected(bytes);
  if (absl::Status s = DequantizeReference(in_, out_dtype_, begin, end, expected.data()); !s.ok()) {
    return s;
  }
  return std::memcmp(expected.data(), data, bytes) == 0;
}

}  // namespace dequantd::bench
