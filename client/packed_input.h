// Builds an inline Dequantize input from a safetensors file holding PREFIXqweight,
// PREFIXqzeros and PREFIXscales (the AWQ GEMM layout, kernels/awq_format.h):
//   qweight int32 (K, N/8), qzeros int32 (K/G, N/8), scales fp16|bf16 (K/G, N).
// K and N come from the shapes (K = qweight rows, N = scales columns); G = K / scales rows unless
// given. Only the structure needed to fill the request is checked here (2-D tensors, known
// dtypes): the server validates the rest and names the field it rejects.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "dequant/v1/dequant.pb.h"

namespace dequantd {

// Errors: NOT_FOUND (file or tensor missing), INVALID_ARGUMENT / DATA_LOSS (corrupt file, a
// tensor that is not 2-D, a scales dtype other than F16/BF16, or G not derivable because the
// scales rows do not divide K and `group_size` is 0).
// `group_size`: 0 = derive from the shapes; any other value is sent as given.
absl::StatusOr<::dequant::v1::InlinePackedTensor> LoadInlinePacked(const std::string& path,
                                                                   const std::string& prefix,
                                                                   int64_t group_size = 0);

}  // namespace dequantd
