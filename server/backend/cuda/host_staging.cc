// Pinned staging of host -> device copies (see host_staging.h).
#include "server/backend/cuda/host_staging.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_status.h"
#include "server/backend/cuda/packed_upload.h"

namespace dequantd::cuda {

absl::Status PinnedStager::Copy(uint8_t* to, const uint8_t* from, int64_t bytes) {
  for (int64_t done = 0; done < bytes;) {
    const size_t b = static_cast<size_t>(chunks_ % 2);
    if (busy_[b]) {
      // The DMA out of this buffer two chunks ago must be done before it is refilled.
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events_[b]));
    }
    const int64_t n = std::min(buffer_bytes_, bytes - done);
    std::memcpy(buffers_[b], from + done, static_cast<size_t>(n));
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(to + done, buffers_[b], static_cast<size_t>(n),
                                                  cudaMemcpyHostToDevice, stream_));
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[b], stream_));
    busy_[b] = true;
    ++chunks_;
    done += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<QuantView> PinnedStager::CopyPacked(const QuantView& host, uint8_t* device_base) {
  const PackedLayout layout(host.shape);
  QuantView view;
  view.shape = host.shape;
  for (int r = 0; r < TensorRoleCount(host.shape.format); ++r) {
    const auto i = static_cast<size_t>(r);
    view.tensors[i] = device_base + layout.offsets[i];
    if (absl::Status s =
            Copy(device_base + layout.offsets[i], static_cast<const uint8_t*>(host.tensors[i]),
                 TensorSpecOf(host.shape, r).bytes());
        !s.ok()) {
      return s;
    }
  }
  return view;
}

}  // namespace dequantd::cuda
