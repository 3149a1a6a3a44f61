// gptq::DequantizeReference: the plain loop over (k, n) that defines the result (see
// gptq_format.h), in either orientation. One element at a time, the scalar conversions of
// kernels/dtype.h, 64-bit indices. Every other GPTQ path is tested bit for bit against this one,
// and this one against GPTQModel's own results (tests/data/formats/gptq/).
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/gptq.h"
#include "kernels/gptq_format.h"
#include "kernels/reference_rows.h"

namespace dequantd::gptq {
absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out) {
  const QuantShape& shape = in.shape;
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
    return static_cast<float>(q - z) * ScaleAsFloat(Scales(in), shape.scale_dtype, g * N + n);
  };
  ForEachResultElement(shape, out_dtype, row_begin, row_end, out, element);
  if (!g_idx_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("g_idx holds a group outside [0, ", groups, ")"));
  }
  return absl::OkStatus();
}

}  // namespace dequantd::gptq
