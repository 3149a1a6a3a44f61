// mxfp4::DequantizeReference: the plain loop over (e, k, n) that defines the result (see
// mxfp4_format.h), in either orientation. One element at a time, 64-bit indices. Every other
// mxfp4 path is tested bit for bit against this one, and this one against transformers'
// convert_moe_packed_tensors results (tests/data/formats/mxfp4/).
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/mxfp4.h"
#include "kernels/mxfp4_format.h"
#include "kernels/reference_rows.h"

namespace dequantd::mxfp4 {

absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out) {
  const QuantShape& shape = in.shape;
  const int64_t K = shape.K;
  const int64_t N = shape.N;
  // w_e[k, n] before round_out: byte (e*N + n, k/2) of blocks, scale (e*N + n, k/32).
  ForEachStackedResultElement(
      shape, out_dtype, row_begin, row_end, out, [&](int64_t e, int64_t k, int64_t n) {
        const int64_t row = e * N + n;
        const uint8_t byte = Blocks(in)[row * (K / 2) + k / 2];
        return Element(NibbleOf(byte, k), Scales(in)[row * (K / kBlockValues) + k / kBlockValues]);
      });
  return absl::OkStatus();
}

}  // namespace dequantd::mxfp4
