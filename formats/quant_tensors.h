// Checks the safetensors tensors of one quantized layer against each other and derives the
// layer's shape, for any format: the format's row (kernels/format_registry.h) says which roles a
// layer has and how their dtypes and dims make a shape; this file names the file, tensor and
// layer in the message. The checkpoint store (server/model/checkpoint.cc) and dequantctl's --packed
// input (client/packed_input.cc) both call it. The limits on the shape (ValidateShape) are the
// caller's next step. Uses kernels/ types and the registry (no I/O).
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "formats/safetensors.h"
#include "kernels/format_registry.h"

namespace dequantd::formats {

// One tensor of a layer: its header entry and the file it is in (named in messages).
struct QuantTensorRef {
  absl::string_view file;  // path of the safetensors file
  // name, dtype, shape; not owned. Null only for an optional role (FormatRow::optional_roles) the
  // layer does not store: "layer '<layer>': tensor '<layer>.<role>' is missing; ..." when the
  // format needs it after all (GPTQ's g_idx with desc_act).
  const safetensors::TensorEntry* entry = nullptr;
};

// Returns the shape of `layer` (its name prefix, for messages) in `format` from its tensors in
// role order (FormatRow::roles; AWQ: qweight, qzeros, scales), or INVALID_ARGUMENT naming the
// file, tensor, layer and field, e.g. for AWQ:
//   "<file>: tensor '<name>' (layer '<layer>'): field 'shape' has 3 dims, want 2"
//   ... field 'dtype' is F32, want I32                (qweight, then qzeros)
//   ... field 'dtype' is F32, want F16 or BF16        (scales)
//   ... field 'shape' is (4, 24), want N = 8 * qweight columns = 16 columns   (scales)
//   ... field 'shape' has 3 rows, which do not divide K = 128 into whole groups (G = K / scales
//       rows)                                         (scales)
//   ... field 'shape' is (2, 4), want (4, 2) = (K/G, N/8)                     (qzeros)
// `tensors` must hold FormatRow::role_count refs; options.config passes the checkpoint's
// declaration to formats that need it (GPTQ). Thread-safe (pure function).
absl::StatusOr<QuantShape> QuantShapeFromTensors(Format format, absl::string_view layer,
                                                 absl::Span<const QuantTensorRef> tensors,
                                                 const StoredTensorOptions& options = {});

}  // namespace dequantd::formats
