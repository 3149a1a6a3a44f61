// DequantizeReference: the plain loop over (k, n) that defines the result (see awq_format.h), in
// either orientation of the result (kNK writes w[k, n] at row n, column k; the loop is
// reference_rows.h's). Deliberately simple: one element at a time, the scalar conversions of
// kernels/dtype.h, 64-bit indices everywhere. Every other path is tested bit for bit against this
// one.
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/awq.h"
#include "kernels/awq_format.h"
#include "kernels/reference_rows.h"

namespace dequantd::awq {
absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out) {
  const int32_t* qweight = Qweight(in);
  const int32_t* qzeros = Qzeros(in);
  const int64_t N = in.shape.N;
  const int64_t G = in.shape.group_size;
  const int64_t words_per_row = N / kPackFactor;
  // w[k, n] of the definition (awq_format.h).
  const auto element = [&](int64_t k, int64_t n) {
    const int64_t g = k / G;
    const int64_t word = n / kPackFactor;
    const int column = static_cast<int>(n % kPackFactor);
    const auto q = static_cast<int32_t>(
        NibbleForColumn(static_cast<uint32_t>(qweight[k * words_per_row + word]), column));
    const auto z = static_cast<int32_t>(
        NibbleForColumn(static_cast<uint32_t>(qzeros[g * words_per_row + word]), column));
    const float s = ScaleAsFloat(Scales(in), in.shape.scale_dtype, g * N + n);
    return static_cast<float>(q - z) * s;
  };
  ForEachResultElement(in.shape, out_dtype, row_begin, row_end, out, element);
  return absl::OkStatus();
}

}  // namespace dequantd::awq
