// The scalar loads and stores every format's CPU reference and CPU path share, and the reference's
// row loop (one element at a time, in either orientation of the result). Host code; the exact
// conversions are kernels/dtype.h's. No format knowledge here: a format passes its element
// function w(k, n) (its header's definition, before the rounding to the output dtype).
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/quant_tensor.h"

namespace dequantd {

// Element `i` of `scales` (fp16, bf16 or fp32 elements, as `scale_dtype` says) as a float (exact).
inline float ScaleAsFloat(const void* scales, DType scale_dtype, int64_t i) {
  if (scale_dtype == DType::kF32) return static_cast<const float*>(scales)[i];
  const uint16_t bits = static_cast<const uint16_t*>(scales)[i];
  return scale_dtype == DType::kF16 ? HalfBitsToFloat(bits) : Bf16BitsToFloat(bits);
}

// out[i] = w rounded once (round to nearest even) to kOut (fp16, bf16 or fp32).
template <DType kOut>
inline void StoreRounded(void* out, int64_t i, float w) {
  if constexpr (kOut == DType::kF16) {
    static_cast<uint16_t*>(out)[i] = FloatToHalfBitsRne(w);
  } else if constexpr (kOut == DType::kBF16) {
    static_cast<uint16_t*>(out)[i] = FloatToBf16BitsRne(w);
  } else {
    static_assert(kOut == DType::kF32);
    static_cast<float*>(out)[i] = w;
  }
}

// StoreRounded for a run-time output dtype (ValidateShape admits fp16, bf16 and fp32 only).
inline void StoreRoundedAs(void* out, DType out_dtype, int64_t i, float w) {
  switch (out_dtype) {
    case DType::kF16:
      return StoreRounded<DType::kF16>(out, i, w);
    case DType::kBF16:
      return StoreRounded<DType::kBF16>(out, i, w);
    default:
      return StoreRounded<DType::kF32>(out, i, w);
  }
}

// The reference's loop: rows [row_begin, row_end) of the result in shape.orientation ((K, N): rows
// k; (N, K): rows n), out[(row - row_begin) * result_cols() + col] = round_out(element(k, n)).
// `element` is called once per output element, k outer for (K, N), n outer for (N, K).
template <class Element>
void ForEachResultElement(const QuantShape& shape, DType out_dtype, int64_t row_begin,
                          int64_t row_end, void* out, const Element& element) {
  const int64_t K = shape.K;
  const int64_t N = shape.N;
  if (shape.orientation == Orientation::kKN) {
    for (int64_t k = row_begin; k < row_end; ++k)
      for (int64_t n = 0; n < N; ++n)
        StoreRoundedAs(out, out_dtype, (k - row_begin) * N + n, element(k, n));
  } else {  // kNK: w_nk[n][k] = w[k, n]
    for (int64_t n = row_begin; n < row_end; ++n)
      for (int64_t k = 0; k < K; ++k)
        StoreRoundedAs(out, out_dtype, (n - row_begin) * K + k, element(k, n));
  }
}

// ForEachResultElement over a shape of shape.experts stacked matrices (QuantShape::experts):
// rows [row_begin, row_end) of the stacked result ((E*K, N), or (E*N, K) for kNK), row r being row
// r % expert_rows() of expert r / expert_rows(); `element(e, k, n)` is called once per output
// element in output order.
template <class Element>
void ForEachStackedResultElement(const QuantShape& shape, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out, const Element& element) {
  const int64_t rows = shape.expert_rows();
  const int64_t cols = shape.result_cols();
  const bool kn = shape.orientation == Orientation::kKN;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t e = r / rows;
    const int64_t row = r % rows;
    for (int64_t c = 0; c < cols; ++c) {
      StoreRoundedAs(out, out_dtype, (r - row_begin) * cols + c,
                     kn ? element(e, row, c) : element(e, c, row));
    }
  }
}

}  // namespace dequantd
