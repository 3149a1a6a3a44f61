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
#include "kernels/quant_tensor.h"

namespace dequantd::bench {

// A quantized layer of any format owned on the host: role r's stored bytes
// (TensorSpecOf(shape, r).bytes(), in 4-byte words so every tensor is 4-byte aligned); an absent
// optional role (RoleAbsent) and the slots past the format's roles are empty.
struct HostPackedTensor {
  QuantShape shape;
  std::array<std::vector<uint32_t>, kMaxTensorRoles> tensors;

  // Role r's bytes (TensorSpecOf(shape, r).bytes()); 0 when absent.
  int64_t role_bytes(int role) const;
  QuantView view() const;
};

// Fresh random inputs for `shape` (which must pass ValidateShape), by each role's stored dtype:
// int32 words uniform over all 2^32 values (every code and zero point); a g_idx role (GPTQ
// "g_idx", compressed-tensors "weight_g_idx") an act-order assignment (row k's group is
// perm(k) / G for a random permutation: every group holds G rows, scattered); compressed-tensors'
// int64 "weight_shape" the layer's (N, K); fp16/bf16/fp32
// scales finite, never zero, random sign, magnitude in [2^-14, 2) (fp16 normal range), so no
// output overflows or is NaN; fp8 e4m3 codes uniform over the 254 non-NaN bytes; E8M0 scales
// (MXFP4's uint8 "scales") uniform over 113..127 (2^-14 .. 2^0, the band quantizers write; the
// slow paths of 0xFF and of scales above 240 are the kernels' tests' business, not a benchmark's);
// other uint8 bytes (MXFP4's blocks: every E2M1 code) uniform. The layer then
// passes its format's stored-value checks (FormatRow::check_stored), else INVALID_ARGUMENT with
// the format's message (a format rule random values cannot meet, e.g. GPTQ's declared sym).
// Deterministic for a given seed.
absl::StatusOr<HostPackedTensor> MakeRandomPackedTensor(const QuantShape& shape, uint64_t seed);
// As above, polling `cancelled` (empty = never) before each role's allocation and every
// kCancelPollBytes of generated values: CANCELLED "benchmark cancelled" once it
// returns true. Same values as above for the same seed.
inline constexpr int64_t kCancelPollBytes = int64_t{4} << 20;
absl::StatusOr<HostPackedTensor> MakeRandomPackedTensor(const QuantShape& shape, uint64_t seed,
                                                        const std::function<bool()>& cancelled);

// A half-open row range [begin, end) of the output's rows (QuantShape::result_rows: K rows for
// kKN, N rows for kNK).
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
