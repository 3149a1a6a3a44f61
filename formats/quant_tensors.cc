// Shape and dtype checks of one quantized layer's safetensors entries (see quant_tensors.h).
#include "formats/quant_tensors.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dequantd::formats {

absl::StatusOr<QuantShape> QuantShapeFromTensors(Format format, absl::string_view layer,
                                                 absl::Span<const QuantTensorRef> tensors,
                                                 const StoredTensorOptions& options) {
  const FormatRow& row = FormatRowOf(format);
  if (static_cast<int>(tensors.size()) != row.role_count) {
    return absl::InvalidArgumentError(absl::StrCat("layer '", layer, "': ", tensors.size(),
                                                   " tensors given, the format has ",
                                                   row.role_count));
  }
  std::vector<StoredTensor> stored;
  stored.reserve(tensors.size());
  for (const QuantTensorRef& t : tensors) {
    if (t.entry == nullptr) {  // an optional role the layer does not store
      stored.push_back(StoredTensor{.dtype = {}, .shape = {}, .present = false});
      continue;
    }
    stored.push_back(StoredTensor{.dtype = t.entry->dtype, .shape = t.entry->shape});
  }
  QuantShape shape;
  StoredTensorProblem problem;
  if (row.shape_from_stored(stored, options, &shape, &problem)) return shape;
  const QuantTensorRef& bad = tensors[static_cast<size_t>(problem.role)];
  if (bad.entry == nullptr) {
    const std::string_view role = row.roles[static_cast<size_t>(problem.role)];
    return absl::InvalidArgumentError(
        absl::StrCat("layer '", layer, "': tensor '", layer,
                     absl::string_view(row.role_separator.data(), row.role_separator.size()),
                     absl::string_view(role.data(), role.size()), "' ", problem.what));
  }
  return absl::InvalidArgumentError(absl::StrCat(bad.file, ": tensor '", bad.entry->name,
                                                 "' (layer '", layer, "'): field '", problem.field,
                                                 "' ", problem.what));
}

}  // namespace dequantd::formats
