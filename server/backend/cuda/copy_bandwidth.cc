// MeasureCopyBandwidth (see copy_bandwidth.h).
#include "server/backend/cuda/copy_bandwidth.h"

#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "server/backend/cuda/cuda_objects.h"

namespace dequantd::cuda {

absl::StatusOr<double> MeasureCopyBandwidth(cudaStream_t stream) {
  constexpr int64_t kBytes = int64_t{256} << 20;
  absl::StatusOr<UniqueDeviceMemory> src = MakeDeviceMemory(kBytes);
  absl::StatusOr<UniqueDeviceMemory> dst = MakeDeviceMemory(kBytes);
  if (!src.ok() || !dst.ok()) {
    cudaGetLastError();  // clear the (non-sticky) allocation error
    return 0.0;
  }
  absl::StatusOr<UniqueEvent> start = MakeEvent(/*timing=*/true);
  if (!start.ok()) return start.status();
  absl::StatusOr<UniqueEvent> end = MakeEvent(/*timing=*/true);
  if (!end.ok()) return end.status();
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src->get(), 1, kBytes, stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst->get(), src->get(), kBytes, cudaMemcpyDeviceToDevice, stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(start->get(), stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst->get(), src->get(), kBytes, cudaMemcpyDeviceToDevice, stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(end->get(), stream));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(end->get()));
  const double seconds = ElapsedSeconds(start->get(), end->get());
  return seconds > 0 ? 2.0 * static_cast<double>(kBytes) / seconds : 0.0;
}

}  // namespace dequantd::cuda
