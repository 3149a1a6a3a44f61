// fp8_block::DequantizeReference: the plain loop over (n, k) that defines the result (see
// fp8_block_format.h), in either orientation. One element at a time, the scalar conversions of
// kernels/dtype.h, 64-bit indices. Every other fp8_block path is tested bit for bit against this
// one, and this one against DeepSeek's weight_dequant results (tests/data/formats/fp8_block/).
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/fp8_block.h"
#include "kernels/fp8_block_format.h"

namespace dequantd::fp8_block {
namespace {

void StoreAt(void* out, DType out_dtype, int64_t i, float w) {
  switch (out_dtype) {
    case DType::kF16:
      static_cast<uint16_t*>(out)[i] = FloatToHalfBitsRne(w);
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(out)[i] = FloatToBf16BitsRne(w);
      return;
    default:  // kF32; ValidateShape refused every other dtype.
      static_cast<float*>(out)[i] = w;
      return;
  }
}

}  // namespace

absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out) {
  const QuantShape& shape = in.shape;
  const int64_t K = shape.K;
  const int64_t N = shape.N;
  const int64_t grid_cols = GridCols(K);
  // w[n, k] of the definition: the fp32 product, then the output's rounding.
  const auto element = [&](int64_t n, int64_t k) {
    const float s =
        ScaleToFloat(ScaleInv(in), shape.scale_dtype, (n / kBlock) * grid_cols + k / kBlock);
    return Fp32Product(Weight(in)[n * K + k], s);
  };
  if (shape.orientation == Orientation::kNK) {
    for (int64_t n = row_begin; n < row_end; ++n)
      for (int64_t k = 0; k < K; ++k)
        StoreAt(out, out_dtype, (n - row_begin) * K + k, element(n, k));
  } else {  // kKN: row k, column n
    for (int64_t k = row_begin; k < row_end; ++k)
      for (int64_t n = 0; n < N; ++n)
        StoreAt(out, out_dtype, (k - row_begin) * N + n, element(n, k));
  }
  return absl::OkStatus();
}

}  // namespace dequantd::fp8_block
