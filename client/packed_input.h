// Builds an inline Dequantize input from a safetensors file holding PREFIXqweight,
// PREFIXqzeros and PREFIXscales (the AWQ GEMM layout, kernels/awq_format.h):
//   qweight int32 (K, N/8), qzeros int32 (K/G, N/8), scales fp16|bf16 (K/G, N).
// The tensors are checked against each other by formats::AwqShapeFromTensors, the same check the
// server's checkpoint store makes (formats/awq_tensors.h; I32 or U32 accepted for the packed
// tensors): K = qweight rows, N = 8 * qweight columns, G = K / scales rows. The limits on K, N
// and G are left to the server, which names the field it rejects.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "dequant/v1/dequant.pb.h"

namespace dequantd {

// Errors: NOT_FOUND (file or tensor missing), DATA_LOSS (truncated file), INVALID_ARGUMENT
// (corrupt file, or a tensor with the wrong dtype or shape: the message names the file, tensor
// and field, e.g. "f.safetensors: tensor 'p.qzeros' (layer 'p'): field 'shape' is (72, 12), want
// (12, 72) = (K/G, N/8)").
// `group_size`: 0 = G from the shapes; any other value is sent as given (the server judges it).
absl::StatusOr<::dequant::v1::InlinePackedTensor> LoadInlinePacked(const std::string& path,
                                                                   const std::string& prefix,
                                                                   int64_t group_size = 0);

}  // namespace dequantd
