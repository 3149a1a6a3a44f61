// compressed_tensors_fp8::DequantizeReference: the plain loop over (n, k) that defines the result
// (see compressed_tensors_fp8_format.h), in either orientation. One element at a time, the scalar
// conversions of kernels/dtype.h, 64-bit indices. Every other path is tested bit for bit against
// this one, and this one against compressed-tensors' own results
// (tests/data/formats/compressed_tensors/ct_fp8_*).
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/compressed_tensors_fp8.h"
#include "kernels/compressed_tensors_fp8_format.h"
#include "kernels/reference_rows.h"

namespace dequantd::compressed_tensors_fp8 {

absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out) {
  const QuantShape& shape = in.shape;
  const int64_t rows_per_scale = RowsPerScale(shape);
  const int64_t cols_per_scale = shape.group_size;
  const int64_t grid_cols = GridDim(shape.K, cols_per_scale);
  // w[k, n] of the definition before round_out: round_sdt(fp32(weight[n, k]) * fp32(s)).
  ForEachResultElement(shape, out_dtype, row_begin, row_end, out, [&](int64_t k, int64_t n) {
    const float s =
        fp8_block::ScaleToFloat(WeightScale(in), shape.scale_dtype,
                                ScaleIndex(n, k, rows_per_scale, cols_per_scale, grid_cols));
    return Element(Weight(in)[n * shape.K + k], s, shape.scale_dtype);
  });
  return absl::OkStatus();
}

}  // namespace dequantd::compressed_tensors_fp8
