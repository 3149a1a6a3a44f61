// Packed tensors on the device (see packed_upload.h).
#include "server/cuda/packed_upload.h"

#include "kernels/cuda/cuda_status.h"

namespace dequantd::cuda {
namespace {
constexpr int64_t kTensorAlign = 256;
constexpr int64_t AlignUp(int64_t bytes) {
  return (bytes + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
}
}  // namespace

PackedLayout::PackedLayout(const AwqShape& shape)
    : qzeros_offset(AlignUp(shape.qweight_bytes())),
      scales_offset(qzeros_offset + AlignUp(shape.qzeros_bytes())),
      total_bytes(scales_offset + shape.scales_bytes()) {}

absl::StatusOr<PackedTensorView> CopyPackedToDevice(const PackedTensorView& host,
                                                    uint8_t* device_base, cudaStream_t stream) {
  const AwqShape& shape = host.shape;
  const PackedLayout layout(shape);
  PackedTensorView view;
  view.shape = shape;
  view.qweight = reinterpret_cast<const int32_t*>(device_base);
  view.qzeros = reinterpret_cast<const int32_t*>(device_base + layout.qzeros_offset);
  view.scales = device_base + layout.scales_offset;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_base, host.qweight, shape.qweight_bytes(),
                                                cudaMemcpyHostToDevice, stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_base + layout.qzeros_offset, host.qzeros,
                                                shape.qzeros_bytes(), cudaMemcpyHostToDevice,
                                                stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_base + layout.scales_offset, host.scales,
                                                shape.scales_bytes(), cudaMemcpyHostToDevice,
                                                stream));
  return view;
}

}  // namespace dequantd::cuda
