// Builds an inline Dequantize input from a safetensors file holding PREFIX<role> for every role
// of `format` (AWQ GEMM, kernels/awq_format.h: PREFIXqweight int32 (K, N/8), PREFIXqzeros int32
// (K/G, N/8), PREFIXscales fp16|bf16 (K/G, N)). The tensors are checked against each other by
// formats::QuantShapeFromTensors, the same check the server's checkpoint store makes
// (formats/quant_tensors.h; I32 or U32 accepted for packed int32 words): for AWQ K = qweight
// rows, N = 8 * qweight columns, G = K / scales rows. The limits on the shape are left to the
// server, which names the field it rejects. AWQ goes in the message's qweight/qzeros/scales
// fields (read by every server version); other formats by role in `tensors`.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "dequant/v1/dequant.pb.h"
#include "kernels/quant_tensor.h"

namespace dequantd {

// Errors: NOT_FOUND (file or tensor missing), DATA_LOSS (truncated file), INVALID_ARGUMENT
// (corrupt file, or a tensor with the wrong dtype or shape: the message names the file, tensor
// and field, e.g. "f.safetensors: tensor 'p.qzeros' (layer 'p'): field 'shape' is (72, 12), want
// (12, 72) = (K/G, N/8)").
// `group_size`: 0 = G from the shapes; any other value is sent as given (the server judges it).
absl::StatusOr<::dequant::v1::InlinePackedTensor> LoadInlinePacked(
    const std::string& path, const std::string& prefix, int64_t group_size = 0,
    Format format = Format::kAwqGemm);

}  // namespace dequantd
