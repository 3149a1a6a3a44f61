#include "measure/packed_inputs.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
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

// One byte of an E4M3FN code that is not NaN (0x7F and 0xFF are E4M3FN's NaNs).
uint8_t RandomE4m3(uint64_t r) {
  const uint8_t b = static_cast<uint8_t>(r % 254);    // 0..253
  return b < 0x7F ? b : static_cast<uint8_t>(b + 1);  // 0..0x7E, 0x80..0xFE
}

bool IsGidxRole(std::string_view role) { return role.ends_with("g_idx"); }

// Whether `spec` holds E8M0 scale exponents (a uint8 scales role of a shape whose scale dtype is
// uint8: MXFP4's "scales").
bool IsE8m0ScalesRole(const TensorSpec& spec, const QuantShape& shape) {
  return spec.dtype == DType::kU8 && shape.scale_dtype == DType::kU8 &&
         spec.role.ends_with("scales");
}

// The E8M0 exponents of kE8m0MinScale..kE8m0MaxScale: 2^-14 .. 2^0, the range of the fp16 / bf16
// scales above. Quantizers write floor(log2(amax)) - 2 + 127 (OCP MX), so real checkpoints hold a
// band like this one; 0xFF (NaN) and the extremes never occur there (the kernels' tests cover
// them).
constexpr uint8_t kE8m0MinScale = 127 - 14;
constexpr uint8_t kE8m0MaxScale = 127;

// Fills `out` (`bytes` of it) with values of `dtype` as described in the header, polling
// `cancelled` every kCancelPollBytes.
absl::Status FillRole(const TensorSpec& spec, const QuantShape& shape, uint64_t& state,
                      const std::function<bool()>& cancelled, uint8_t* out) {
  const int64_t bytes = spec.bytes();
  if (IsGidxRole(spec.role)) {  // act-order: group of row k = perm(k) / G
    std::vector<int32_t> perm(static_cast<size_t>(spec.elements()));
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int32_t>(i);
    for (size_t i = perm.size(); i > 1; --i) {  // Fisher-Yates
      std::swap(perm[i - 1], perm[static_cast<size_t>(SplitMix64(state) % i)]);
    }
    for (int32_t& g : perm) g = static_cast<int32_t>(g / shape.group_size);
    std::memcpy(out, perm.data(), static_cast<size_t>(bytes));
    return CheckCancelled(cancelled);
  }
  if (spec.role == "weight_shape" && spec.dtype == DType::kI64 && spec.elements() == 2) {
    const int64_t dims[2] = {shape.N, shape.K};  // compressed-tensors' dense shape (N, K)
    std::memcpy(out, dims, sizeof dims);
    return CheckCancelled(cancelled);
  }
  const bool e8m0 = IsE8m0ScalesRole(spec, shape);
  const int64_t size = DTypeSize(spec.dtype);
  for (int64_t at = 0; at < bytes; at += size) {
    if (at % kCancelPollBytes == 0) {
      if (absl::Status c = CheckCancelled(cancelled); !c.ok()) return c;
    }
    const uint64_t r = SplitMix64(state);
    switch (spec.dtype) {
      case DType::kF16:
      case DType::kBF16: {
        const uint16_t v = RandomScaleBits(spec.dtype, r);
        std::memcpy(out + at, &v, 2);
        break;
      }
      case DType::kF32: {  // the fp16 range, widened exactly: one definition of it
        const float v = HalfBitsToFloat(RandomScaleBits(DType::kF16, r));
        std::memcpy(out + at, &v, 4);
        break;
      }
      case DType::kF8E4M3:
        out[at] = RandomE4m3(r);
        break;
      case DType::kU8:
        out[at] =
            e8m0 ? static_cast<uint8_t>(kE8m0MinScale + r % (kE8m0MaxScale - kE8m0MinScale + 1))
                 : static_cast<uint8_t>(r);
        break;
      default:  // int32 words (and any other integer): uniform bits
        std::memcpy(out + at, &r, static_cast<size_t>(size));
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t HostPackedTensor::role_bytes(int role) const {
  if (role >= TensorRoleCount(shape.format) || RoleAbsent(shape, role)) return 0;
  return TensorSpecOf(shape, role).bytes();
}

QuantView HostPackedTensor::view() const {
  QuantView v;
  v.shape = shape;
  for (int r = 0; r < TensorRoleCount(shape.format); ++r) {
    const std::vector<uint32_t>& t = tensors[static_cast<size_t>(r)];
    v.tensors[static_cast<size_t>(r)] = role_bytes(r) > 0 ? t.data() : nullptr;
  }
  return v;
}

absl::StatusOr<HostPackedTensor> MakeRandomPackedTensor(const QuantShape& shape, uint64_t seed) {
  return MakeRandomPackedTensor(shape, seed, nullptr);
}

absl::StatusOr<HostPackedTensor> MakeRandomPackedTensor(const QuantShape& shape, uint64_t seed,
                                                        const std::function<bool()>& cancelled) {
  HostPackedTensor t;
  t.shape = shape;
  uint64_t state = seed;
  for (int r = 0; r < TensorRoleCount(shape.format); ++r) {
    if (absl::Status c = CheckCancelled(cancelled); !c.ok()) return c;
    const int64_t bytes = t.role_bytes(r);
    if (bytes == 0) continue;
    std::vector<uint32_t>& words = t.tensors[static_cast<size_t>(r)];
    words.assign(static_cast<size_t>((bytes + 3) / 4), 0);
    if (absl::Status s = FillRole(TensorSpecOf(shape, r), shape, state, cancelled,
                                  reinterpret_cast<uint8_t*>(words.data()));
        !s.ok()) {
      return s;
    }
  }
  const FormatRow& row = FormatRowOf(shape.format);
  if (row.check_stored != nullptr) {
    if (absl::Status s = row.check_stored(t.view()); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("random ", std::string(FormatName(shape.format)),
                       " inputs do not meet the format's stored-value rules: ", s.message()));
    }
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
  const int64_t rows_total = in_.shape.result_rows();
  if (full_) return {{0, rows_total}};
  std::vector<int64_t> rows = {0, rows_total - 1};
  std::uniform_int_distribution<int64_t> row(0, rows_total - 1);
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
