#include "measure/packed_inputs.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/format_checks.h"
#include "kernels/format_registry.h"
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

// Fills `bytes` (a multiple of 4) with int32 words of SplitMix64 output (two words per draw),
// polling `cancelled` every kCancelPollBytes.
absl::Status FillWords(std::vector<uint8_t>& bytes, uint64_t& state,
                       const std::function<bool()>& cancelled) {
  const size_t words = bytes.size() / 4;
  constexpr size_t kPollWords = kCancelPollBytes / sizeof(int32_t);  // even
  const auto put = [&](size_t i, uint32_t w) { std::memcpy(bytes.data() + 4 * i, &w, 4); };
  for (size_t block = 0; block < words; block += kPollWords) {
    if (absl::Status c = CheckCancelled(cancelled); !c.ok()) return c;
    const size_t end = std::min(words, block + kPollWords);
    size_t i = block;
    for (; i + 1 < end; i += 2) {
      const uint64_t r = SplitMix64(state);
      put(i, static_cast<uint32_t>(r));
      put(i + 1, static_cast<uint32_t>(r >> 32));
    }
    if (i < end) put(i, static_cast<uint32_t>(SplitMix64(state)));
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

// Fills `bytes` with elements of `dtype` (see MakeRandomPackedTensor), one draw per element (fp16,
// bf16, fp32) or per byte, polling `cancelled` every kCancelPollBytes.
absl::Status FillElements(std::vector<uint8_t>& bytes, DType dtype, uint64_t& state,
                          const std::function<bool()>& cancelled) {
  const size_t size = static_cast<size_t>(DTypeSize(dtype));
  const size_t elements = bytes.size() / size;
  const size_t poll = kCancelPollBytes / size;
  for (size_t i = 0; i < elements; ++i) {
    if (i % poll == poll - 1) {
      if (absl::Status c = CheckCancelled(cancelled); !c.ok()) return c;
    }
    const uint64_t r = SplitMix64(state);
    if (dtype == DType::kF16 || dtype == DType::kBF16) {
      const uint16_t bits = RandomScaleBits(dtype, r);
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    } else if (dtype == DType::kF32) {  // the fp16 range, widened exactly
      const float f = HalfBitsToFloat(RandomScaleBits(DType::kF16, r));
      std::memcpy(bytes.data() + 4 * i, &f, 4);
    } else if (dtype == DType::kF8E4M3) {
      bytes[i] = static_cast<uint8_t>(r);
      if ((bytes[i] & 0x7F) == 0x7F) bytes[i] &= 0xFE;  // no NaN
    } else {
      bytes[i] = static_cast<uint8_t>(r);
    }
  }
  return absl::OkStatus();
}

}  // namespace

HostPackedTensor MakeRandomPackedTensor(const QuantShape& shape, uint64_t seed) {
  return *MakeRandomPackedTensor(shape, seed, nullptr);  // never cancelled; format as required
}

absl::StatusOr<HostPackedTensor> MakeRandomPackedTensor(const QuantShape& shape, uint64_t seed,
                                                        const std::function<bool()>& cancelled) {
  const FormatRow& row = FormatRowOf(shape.format);
  if (row.check_stored != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "benchmark inputs are random bytes, which format ", AbslView(row.name),
        "'s stored-value checks would refuse; it cannot be benchmarked on random inputs"));
  }
  HostPackedTensor t;
  t.shape = shape;
  uint64_t state = seed;
  for (int r = 0; r < row.role_count; ++r) {
    if (absl::Status c = CheckCancelled(cancelled); !c.ok()) return c;
    const TensorSpec spec = TensorSpecOf(shape, r);
    std::vector<uint8_t>& bytes = t.tensors[static_cast<size_t>(r)];
    bytes.resize(static_cast<size_t>(spec.bytes()));
    const absl::Status s = spec.dtype == DType::kI32
                               ? FillWords(bytes, state, cancelled)
                               : FillElements(bytes, spec.dtype, state, cancelled);
    if (!s.ok()) return s;
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
            DequantizeReference(in, out_dtype, 0, in.shape.result_rows(), checker.expected_.data());
        !s.ok()) {
      return s;
    }
  } else if (absl::Status s = ValidateShape(in.shape, out_dtype); !s.ok()) {
    return s;
  }
  return checker;
}

std::vector<RowRange> OutputChecker::PickRows(std::mt19937_64& rng, int sampled_rows) const {
  const int64_t K = in_.shape.result_rows();
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
  if (begin < 0 || end > in_.shape.result_rows() || begin >= end) {
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
