// Benchmark inputs on the host: random packed layers, and the check of a variant's output against
// the CPU reference (kernels/dequant.h) on all rows or on sampled rows.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/dequant.h"

namespace dequantd::bench {

// A quantized layer of any format owned on the host: role r's bytes (TensorSpecOf(shape, r),
// row-major, little-endian) in tensors[r]; AWQ: qweight (K, N/8) int32, qzeros (K/G, N/8) int32,
// scales (K/G, N) fp16 or bf16; mxfp4: blocks (E*N, K/2) and scales (E*N, K/32) bytes.
struct HostPackedTensor {
  QuantShape shape;
  std::array<std::vector<uint8_t>, kMaxTensorRoles> tensors;

  QuantView view() const {
    QuantView v;
    v.shape = shape;
    for (size_t r = 0; r < tensors.size(); ++r)
      v.tensors[r] = tensors[r].empty() ? nullptr : tensors[r].data();
    return v;
  }
};

// Fresh random inputs for `shape` (which must pass ValidateShape), role by role, by the role's
// dtype: int32 words uniform over all 2^32 values (AWQ: all 16 nibble values, zero points
// included); fp16/bf16 scales finite, never zero, random sign, magnitude in [2^-14, 2) (fp16
// normal range; same range for bf16), so no AWQ output overflows or is NaN; fp32 scales the same
// values; E4M3 bytes uniform without the NaN bytes 0x7F / 0xFF; other bytes (mxfp4's blocks and
// E8M0 scales, 0xFF included) uniform. Deterministic for a given seed (AWQ draws as before the
// roles were generic). Formats with rules on their stored values (FormatRow::check_stored: GPTQ's
// g_idx, compressed-tensors' weight_shape) are INVALID_ARGUMENT (the overload below): random
// bytes would break them; this overload requires a format without them.
HostPackedTensor MakeRandomPackedTensor(const QuantShape& shape, uint64_t seed);

// As above, polling `cancelled` (empty = never) before each role's allocation and every
// kCancelPollBytes of generated words or scales: CANCELLED "benchmark cancelled" once it
// returns true. Same values as above for the same seed.
inline constexpr int64_t kCancelPollBytes = int64_t{4} << 20;
absl::StatusOr<HostPackedTensor> MakeRandomPackedTensor(const QuantShape& shape, uint64_t seed,
                                                        const std::function<bool()>& cancelled);

// A half-open row range [begin, end) of the output's rows (QuantShape::result_rows()).
using RowRange = std::pair<int64_t, int64_t>;

// Compares a variant's output rows with DequantizeReference, bit for bit.
// Thread-compatible (const methods may be called concurrently).
class OutputChecker {
 public:
  // `in` must outlive the checker. Outputs of at most `full_check_max_elements` elements are
  // compared in full (the reference is computed once, here); larger ones on sampled rows.
  // Errors: those of DequantizeReference (INVALID_ARGUMENT).
  static absl::StatusOr<OutputChecker> Create(const QuantView& in, DType out_dtype,
                                              int64_t full_check_max_elements);

  bool full() const { return full_; }

  // The rows to compare for one trial: all rows when full(), else the first, the last and
  // `sampled_rows` random rows (as single-row ranges, sorted, without duplicates).
  std::vector<RowRange> PickRows(std::mt19937_64& rng, int sampled_rows) const;

  // Whether `data`, rows [range.first, range.second) of the output ((end - begin) *
  // result_cols() elements of out_dtype), equals the reference bit for bit.
  absl::StatusOr<bool> Matches(RowRange range, const void* data) const;

  int64_t row_bytes() const { return in_.shape.result_cols() * DTypeSize(out_dtype_); }

 private:
  OutputChecker(const QuantView& in, DType out_dtype) : in_(in), out_dtype_(out_dtype) {}

  QuantView in_;
  DType out_dtype_;
  bool full_ = false;
  std::vector<uint8_t> expected_;  // the whole reference output when full_
};

}  // namespace dequantd::bench
