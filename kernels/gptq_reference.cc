// gptq::DequantizeReference: the plain loop over (k, n) that defines the result (see
// gptq_format.h), in either orientation. One element at a time, the scalar conversions of
// kernels/dtype.h, 64-bit indices. Every other GPTQ path is tested bit for bit against this one,
// and this one against GPTQModel's own results (tests/data/formats/gptq/).
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/gptq.h"
#include "kernels/gptq_format.h"

namespace dequantd::gptq {
namespace {

float ScaleAt(const void* scales, DType scale_dtype, int64_t i) {
  const uint16_t bits = static_cast<const uint16_t*>(scales)[i];
  return scale_dtype == DType::kF16 ? HalfBitsToFloat(bits) : Bf16BitsToFloat(bits);
}

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
  const int bits = shape.bits;
  const int64_t zero_words = StreamWords(N, bits);
  const int32_t* g_idx = Gidx(in);
  const int64_t groups = shape.groups();
  // w[k, n] of the definition; g_idx out of range (CheckStored refuses it at load) is an error
  // here too rather than a read outside scales.
  bool g_idx_ok = true;
  const auto element = [&](int64_t k, int64_t n) {
    int64_t g = g_idx != nullptr ? g_idx[k] : k / shape.group_size;
    if (g < 0 || g >= groups) {
      g_idx_ok = false;
      g = 0;
    }
    const auto q = static_cast<int32_t>(StreamField(Qweight(in) + n, N, k, bits));
    const auto z =
        static_cast<int32_t>(ZeroAt(Qzeros(in) + g * zero_words, n, bits, shape.format_flags));
    return static_cast<float>(q - z) * ScaleAt(Scales(in), shape.scale_dtype, g * N + n);
  };
  if (shape.orientation == Orientation::kKN) {
    for (int64_t k = row_begin; k < row_end; ++k)
      for (int64_t n = 0; n < N; ++n)
        StoreAt(out, out_dtype, (k - row_begin) * N + n, element(k, n));
  } else {  // kNK: row n, column k
    for (int64_t n = row_begin; n < row_end; ++n)
      for (int64_t k = 0; k < K; ++k)
        StoreAt(out, out_dtype, (n - row_begin) * K + k, element(k, n));
  }
  if (!g_idx_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("g_idx holds a group outside [0, ", groups, ")"));
  }
  return absl::OkStatus();
}

}  // namespace dequantd::gptq
