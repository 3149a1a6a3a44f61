// Benchmark inputs on the host: random packed layers, and the check of a variant's output against
// the CPU reference (kernels/dequant.h) on all rows or on sampled rows.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/awq_format.h"
#include "kernels/dequant.h"

namespace dequantd::bench {

// A packed layer owned on the host. qweight: (K, N/8) int32; qzeros: (K/G, N/8) int32;
// scales: (K/G, N) fp16 or bf16 bits.
struct HostPackedTensor {
  QuantShape shape;
  std::vector<int32_t> qweight;
  std::vector<int32_t> qzeros;
  std::vector<uint16_t> scales;

  QuantView view() const {
    return awq::MakeView(shape, qweight.data(), qzeros.data(), scales.data());
  }
};

// Fresh random inputs for `shape` (which must pass ValidateShape): every qweight/qzeros word
// uniform over all 2^32 values (all 16 nibble values, zero points included); scales finite,
// never zero, random sign, magnitude in [2^-14, 2) (fp16 normal range; same range for bf16),
// so no output overflows or is NaN. Deterministic for a given seed.
HostPackedTensor MakeRandomPackedTensor(const QuantShape& shape, uint64_t seed);

// As above, polling `cancelled` (empty = never) before each of the three allocations and every
// kCancelPollBytes of generated words or scales: CANCELLED "benchmark cancelled" once it
// returns true. Same values as above for the same seed.
inline constexpr int64_t kCancelPollBytes = int64_t{4} << 20;
absl::StatusOr<HostPackedTensor> MakeRandomPackedTensor(const QuantShape& shape, uint64_t seed,
                                                        const std::function<bool()>& cancelled);

// A half-open row range [begin, end) of the (K, N) output.
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

  // Whether `data`, rows [range.first, range.second) of the output ((end - begin) * N elements of
  // out_dtype), equals the reference bit for bit.
  absl::StatusOr<bool> Matches(RowRange range, const void* data) const;

  int64_t row_bytes() const { return in_.shape.N * DTypeSize(out_dtype_); }

 private:
  OutputChecker(const QuantView& in, DType out_dtype) : in_(in), out_dtype_(out_dtype) {}

  QuantView in_;
  DType out_dtype_;
  bool full_ = false;
  std::vector<uint8_t> expected_;  // the whole reference output when full_
};

}  // namespace dequantd::bench
