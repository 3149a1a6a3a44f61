// DequantizeReference: the plain loop over (k, n) that defines the result (see awq_format.h), in
// either orientation of the result (kNK writes w[k, n] at row n, column k).
// Deliberately simple: one element at a time, the scalar conversions of awq_format.h, 64-bit
// indices everywhere. Every other path is tested bit for bit against this one.
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/awq.h"
#include "kernels/awq_format.h"

namespace dequantd::awq {
namespace {

// scales[i] as float; `scales` holds fp16 or bf16 bits.
float ScaleAt(const void* scales, DType scale_dtype, int64_t i) {
  const uint16_t bits = static_cast<const uint16_t*>(scales)[i];
  return scale_dtype == DType::kF16 ? HalfBitsToFloat(bits) : Bf16BitsToFloat(bits);
}

// out[i] = w, rounded once (round to nearest even) to `out_dtype`.
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
  const int32_t* qweight = Qweight(in);
  const int32_t* qzeros = Qzeros(in);
  const int64_t K = in.shape.K;
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
    const float s = ScaleAt(Scales(in), in.shape.scale_dtype, g * N + n);
    return static_cast<float>(q - z) * s;
  };
  if (in.shape.orientation == Orientation::kKN) {
    for (int64_t k = row_begin; k < row_end; ++k)
      for (int64_t n = 0; n < N; ++n)
        StoreAt(out, out_dtype, (k - row_begin) * N + n, element(k, n));
  } else {  // kNK: w_nk[n][k] = w[k, n]
    for (int64_t n = row_begin; n < row_end; ++n)
      for (int64_t k = 0; k < K; ++k)
        StoreAt(out, out_dtype, (n - row_begin) * K + k, element(k, n));
  }
  return absl::OkStatus();
}

}  // namespace dequantd::awq
