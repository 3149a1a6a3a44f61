// Packed tensors on the device (see packed_upload.h).
#include "server/backend/cuda/packed_upload.h"

#include "kernels/cuda/cuda_status.h"

namespace dequantd::cuda {
namespace {
constexpr int64_t kTensorAlign = 256;
constexpr int64_t AlignUp(int64_t bytes) {
  return (bytes + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
}
}  // namespace

PackedLayout::PackedLayout(const QuantShape& shape) {
  const int roles = TensorRoleCount(shape.format);
  for (int r = 0; r < roles; ++r) {
    total_bytes = AlignUp(total_bytes);
    offsets[static_cast<size_t>(r)] = total_bytes;
    total_bytes += TensorSpecOf(shape, r).bytes();
  }
}

absl::StatusOr<QuantView> CopyPackedToDevice(const QuantView& host, uint8_t* device_base,
                                             cudaStream_t stream) {
  const QuantShape& shape = host.shape;
  const PackedLayout layout(shape);
  QuantView view;
  view.shape = shape;
  const int roles = TensorRoleCount(shape.format);
  for (int r = 0; r < roles; ++r) {
    const auto i = static_cast<size_t>(r);
    uint8_t* dst = device_base + layout.offsets[i];
    view.tensors[i] = dst;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        dst, host.tensors[i], TensorSpecOf(shape, r).bytes(), cudaMemcpyHostToDevice, stream));
  }
  return view;
}

}  // namespace dequantd::cuda
