// DequantizeCpu: temporary single-threaded stand-in that delegates to the reference (being
// replaced by the threaded, word-at-a-time path).
#include "kernels/dequant.h"

namespace dequantd {

absl::Status DequantizeCpu(const PackedTensorView& in, DType out_dtype, int64_t row_begin,
                           int64_t row_end, void* out, int /*threads*/) {
  return DequantizeReference(in, out_dtype, row_begin, row_end, out);
}

}  // namespace dequantd
