// Host -> device copies of pageable host memory (an inline request's packed bytes, the host copy
// of a layer no GPU holds: docs/architecture.md "Models larger than the GPU") through a request
// slot's two pinned upload buffers, reused chunk after chunk: chunk i is memcpy'd into buffer
// i % 2 while chunk i - 1 crosses PCIe, and a buffer is refilled only once the event recorded
// after its last DMA has completed. So the copy runs as a pinned DMA (cudaMemcpyAsync from
// pageable memory would make the driver stage it, synchronizing the stream first), and no
// pinned copy of a layer, let alone of the model, is ever made.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/dequant.h"

namespace dequantd::cuda {

// One call's stager over a slot's upload buffers; not thread-safe (one call at a time holds a
// slot). The buffers may be reused by another stager only after `stream` has drained (the
// pipeline drains it at the end of every call).
class PinnedStager {
 public:
  // `buffers`: two pinned host buffers of `buffer_bytes` (>= 1) each; `events`: one per buffer
  // (current device); `stream`: where the copies are enqueued. All must outlive the stager.
  PinnedStager(std::array<uint8_t*, 2> buffers, int64_t buffer_bytes,
               std::array<cudaEvent_t, 2> events, cudaStream_t stream)
      : buffers_(buffers), buffer_bytes_(buffer_bytes), events_(events), stream_(stream) {}

  // Enqueues on the stream the copy of `bytes` bytes from host `from` to device `to`. Returns
  // once every chunk is enqueued: `from` may then change, the last (up to two) DMAs may still
  // run, ordered before later work on the stream. INTERNAL on a CUDA error.
  absl::Status Copy(uint8_t* to, const uint8_t* from, int64_t bytes);

  // The stored tensors of `host` (host pointers, any format) into `device_base`
  // (PackedLayout(host.shape).total_bytes bytes of device memory): the device view.
  absl::StatusOr<QuantView> CopyPacked(const QuantView& host, uint8_t* device_base);

 private:
  const std::array<uint8_t*, 2> buffers_;
  const int64_t buffer_bytes_;
  const std::array<cudaEvent_t, 2> events_;
  cudaStream_t const stream_;
  int64_t chunks_ = 0;          // chunks enqueued; chunk i used buffer i % 2
  std::array<bool, 2> busy_{};  // a DMA out of buffer b was enqueued (its event recorded)
};

}  // namespace dequantd::cuda
