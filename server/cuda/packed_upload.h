// Packed AWQ tensors (qweight, qzeros, scales) in one device allocation: the layout and the
// host -> device copy, shared by the resident model and inline requests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/dequant.h"

namespace dequantd::cuda {

// Byte offsets of qweight | qzeros | scales in one allocation, each 256-byte aligned.
struct PackedLayout {
  explicit PackedLayout(const AwqShape& shape);
  int64_t qzeros_offset;
  int64_t scales_offset;
  int64_t total_bytes;
};

// Enqueues the copy of `host`'s three tensors into `device_base` (PackedLayout(host.shape)
// bytes) on `stream` and returns the device view. `host` must stay valid until the stream has
// done the copies. INTERNAL on a CUDA error.
absl::StatusOr<PackedTensorView> CopyPackedToDevice(const PackedTensorView& host,
                                                    uint8_t* device_base, cudaStream_t stream);

}  // namespace dequantd::cuda
