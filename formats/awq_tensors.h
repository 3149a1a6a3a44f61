// Checks the three safetensors tensors of one AWQ GEMM layer against each other and derives the
// layer's shape. The one place that knows which dtypes and shapes qweight, qzeros and scales
// must have on disk (the layout itself is kernels/awq_format.h); the checkpoint store
// (server/checkpoint.cc) and dequantctl's --packed input (client/packed_input.cc) both call it.
//   qweight: (K, N/8) I32;  qzeros: (K/G, N/8) I32;  scales: (K/G, N) F16 or BF16.
// K = qweight rows, N = 8 * qweight columns, G = K / scales rows (must divide K). The limits on
// K, N and G (kernels/dequant.h ValidateShape) are the caller's next step.
// Uses the AwqShape and DType types of kernels/dequant.h (header only: no link to the kernels).
#pragma once

#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "formats/safetensors.h"
#include "kernels/dequant.h"

namespace dequantd::formats {

// One tensor of a layer: its header entry and the file it is in (named in messages).
struct AwqTensorRef {
  absl::string_view file;                           // path of the safetensors file
  const safetensors::TensorEntry* entry = nullptr;  // name, dtype, shape; not owned, non-null
};

struct AwqTensorsOptions {
  // Also accept U32 for qweight and qzeros (the same 32 bits as I32). dequantctl does; the
  // checkpoint store serves I32 only, as AutoAWQ writes.
  bool packed_u32 = false;
};

// Returns K, N, G and the scales dtype of `layer` (its name prefix, for messages), or
// INVALID_ARGUMENT naming the file, tensor, layer and field, in this order of checks:
//   "<file>: tensor '<name>' (layer '<layer>'): field 'shape' has 3 dims, want 2"
//   ... field 'dtype' is F32, want I32                (qweight, then qzeros)
//   ... field 'dtype' is F32, want F16 or BF16        (scales)
//   ... field 'shape' is (4, 24), want N = 8 * qweight columns = 16 columns   (scales)
//   ... field 'shape' has 3 rows, which do not divide K = 128 into whole groups (G = K / scales
//       rows)                                         (scales)
//   ... field 'shape' is (2, 4), want (4, 2) = (K/G, N/8)                     (qzeros)
// Thread-safe (pure function).
absl::StatusOr<AwqShape> AwqShapeFromTensors(absl::string_view layer, const AwqTensorRef& qweight,
                                             const AwqTensorRef& qzeros, const AwqTensorRef& scales,
                                             const AwqTensorsOptions& options = {});

}  // namespace dequantd::formats
