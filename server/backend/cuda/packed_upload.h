// A layer's stored tensors (any format, in role order) in one device allocation: the layout and
// the host -> device copy, shared by the resident model and inline requests.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/dequant.h"

namespace dequantd::cuda {

// Byte offsets of the format's tensors in role order in one allocation, each 256-byte aligned.
struct PackedLayout {
  explicit PackedLayout(const QuantShape& shape);
  std::array<int64_t, kMaxTensorRoles> offsets{};  // of role r; unused roles 0
  int64_t total_bytes = 0;
};

// Enqueues the copy of `host`'s tensors into `device_base` (PackedLayout(host.shape)
// bytes) on `stream` and returns the device view. `host` must stay valid until the stream has
// done the copies. INTERNAL on a CUDA error.
absl::StatusOr<QuantView> CopyPackedToDevice(const QuantView& host, uint8_t* device_base,
                                             cudaStream_t stream);

}  // namespace dequantd::cuda
