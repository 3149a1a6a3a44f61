// Shape and dtype checks of one AWQ layer's safetensors entries (see awq_tensors.h).
#include "formats/awq_tensors.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dequantd::formats {
namespace {

absl::Status FieldError(absl::string_view layer, const AwqTensorRef& ref, absl::string_view field,
                        absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(ref.file, ": tensor '", ref.entry->name,
                                                 "' (layer '", layer, "'): field '", field, "' ",
                                                 what));
}

}  // namespace

absl::StatusOr<AwqShape> AwqShapeFromTensors(absl::string_view layer, const AwqTensorRef& qweight,
                                             const AwqTensorRef& qzeros, const AwqTensorRef& scales,
                                             const AwqTensorsOptions& options) {
  for (const AwqTensorRef* r : {&qweight, &qzeros, &scales}) {
    if (r->entry->shape.size() != 2) {
      return FieldError(layer, *r, "shape",
                        absl::StrCat("has ", r->entry->shape.size(), " dims, want 2"));
    }
  }
  for (const AwqTensorRef* r : {&qweight, &qzeros}) {
    const std::string& dtype = r->entry->dtype;
    if (dtype == "I32" || (options.packed_u32 && dtype == "U32")) continue;
    return FieldError(
        layer, *r, "dtype",
        absl::StrCat("is ", dtype, ", want I32", options.packed_u32 ? " or U32" : ""));
  }
  AwqShape shape;
  if (scales.entry->dtype == "F16") {
    shape.scale_dtype = DType::kF16;
  } else if (scales.entry->dtype == "BF16") {
    shape.scale_dtype = DType::kBF16;
  } else {
    return FieldError(layer, scales, "dtype",
                      absl::StrCat("is ", scales.entry->dtype, ", want F16 or BF16"));
  }
  const int64_t packed_cols = qweight.entry->shape[1];
  if (packed_cols > kMaxOutputElements / awq::kPackFactor) {  // keeps N = 8 * columns in range
    return FieldError(layer, qweight, "shape",
                      absl::StrCat("has ", packed_cols, " columns, over the limit of ",
                                   kMaxOutputElements / awq::kPackFactor));
  }
  shape.K = qweight.entry->shape[0];
  shape.N = packed_cols * awq::kPackFactor;
  const int64_t groups = scales.entry->shape[0];
  if (scales.entry->shape[1] != shape.N) {
    return FieldError(layer, scales, "shape",
                      absl::StrCat("is (", groups, ", ", scales.entry->shape[1],
                                   "), want N = 8 * qweight columns = ", shape.N, " columns"));
  }
  if (groups <= 0 || shape.K % groups != 0) {
    return FieldError(layer, scales, "shape",
                      absl::StrCat("has ", groups, " rows, which do not divide K = ", shape.K,
                                   " into whole groups (G = K / scales rows)"));
  }
  shape.group_size = shape.K / groups;
  if (qzeros.entry->shape[0] != groups || qzeros.entry->shape[1] != packed_cols) {
    return FieldError(layer, qzeros, "shape",
                      absl::StrCat("is (", qzeros.entry->shape[0], ", ", qzeros.entry->shape[1],
                                   "), want (", groups, ", ", packed_cols, ") = (K/G, N/8)"));
  }
  return shape;
}

}  // namespace dequantd::formats
