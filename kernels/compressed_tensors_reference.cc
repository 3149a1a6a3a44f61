// compressed_tensors::DequantizeReference: the plain loop over (k, n) that defines the result (see
// compressed_tensors_format.h), in either orientation (the loop is reference_rows.h's). One
// element at a time, the scalar conversions of kernels/dtype.h, 64-bit indices. Every other
// compressed-tensors path is tested bit for bit against this one, and this one against
// compressed-tensors' own results (tests/data/formats/compressed_tensors/).
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/compressed_tensors.h"
#include "kernels/compressed_tensors_format.h"
#include "kernels/reference_rows.h"

namespace dequantd::compressed_tensors {

absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out) {
  const QuantShape& shape = in.shape;
  const int bits = shape.bits;
  const int64_t row_words = PackedRowWords(shape.K, bits);
  const int64_t groups = shape.groups();
  const int32_t* g_idx = WeightGidx(in);
  const int32_t* zero_point = WeightZeroPoint(in);
  // w[k, n] of the definition before round_out; a g_idx out of range (CheckStored refuses it at
  // load) is an error here too rather than a read outside weight_scale.
  bool g_idx_ok = true;
  const auto element = [&](int64_t k, int64_t n) {
    int64_t g = g_idx != nullptr ? g_idx[k] : k / shape.group_size;
    if (g < 0 || g >= groups) {
      g_idx_ok = false;
      g = 0;
    }
    const auto f = static_cast<int32_t>(StreamField(WeightPacked(in) + n * row_words, 1, k, bits));
    const auto z = static_cast<int32_t>(ZeroAt(zero_point, n, g, groups, bits));
    const float s = ScaleAsFloat(WeightScale(in), shape.scale_dtype,
                                 ScaleIndex(n, g, groups, shape.format_flags));
    return RoundToScaleDType(static_cast<float>(f - z) * s, shape.scale_dtype);
  };
  ForEachResultElement(shape, out_dtype, row_begin, row_end, out, element);
  if (!g_idx_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_g_idx holds a group outside [0, ", groups, ")"));
  }
  return absl::OkStatus();
}

}  // namespace dequantd::compressed_tensors
