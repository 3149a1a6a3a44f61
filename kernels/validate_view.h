// Checks of a whole dequantization call on host pointers: the shape (ValidateShape), the
// pointers and the row range. Shared by DequantizeReference and DequantizeCpu; usable by any
// entry point that takes a QuantView plus [row_begin, row_end).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dequant.h"

namespace dequantd {

// Returns ValidateShape's error, or INVALID_ARGUMENT naming the role (AWQ: "qweight", "qzeros" or
// "scales"; an absent optional role may be null) when its pointer is null, "row range" unless
// 0 <= row_begin <= row_end <= result_rows() (K, or N for kNK), and "out"
// when it is null and the range is not empty. OK otherwise. Thread-safe (reads only).
absl::Status ValidateView(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                          const void* out);

}  // namespace dequantd
