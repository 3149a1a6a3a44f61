// CUDA pieces shared by the benchmark's CUDA backend (benchmark_cuda.cu) and the grouped benchmark
// (grouped.cu): owning handles, 256-byte aligned device allocation, an event timer on a
// non-blocking stream and the device-to-device copy yardstick. CUDA builds only. Not thread-safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_status.h"

namespace dequantd::bench {

// ---- Owning handles. --------------------------------------------------------------------------

// A deleter calling the CUDA destroy function `Destroy` (cudaFree, cudaEventDestroy, ...).
template <auto Destroy>
struct CudaDeleter {
  template <typename Handle>
  void operator()(Handle h) const {
    Destroy(h);
  }
};
template <typename Handle, auto Destroy>
using CudaHandle = std::unique_ptr<std::remove_pointer_t<Handle>, CudaDeleter<Destroy>>;

using DeviceBuffer = std::unique_ptr<void, CudaDeleter<cudaFree>>;
using Event = CudaHandle<cudaEvent_t, cudaEventDestroy>;
using Stream = CudaHandle<cudaStream_t, cudaStreamDestroy>;
using GraphExec = CudaHandle<cudaGraphExec_t, cudaGraphExecDestroy>;
using Graph = CudaHandle<cudaGraph_t, cudaGraphDestroy>;

// The device a benchmark runs on: its properties and L2 size in bytes.
struct SelectedDevice {
  cudaDeviceProp prop;
  int l2_bytes = 0;
};

// cudaSetDevice(device), then its properties. Errors: the CUDA error as a Status.
absl::StatusOr<SelectedDevice> SelectDevice(int device);

// `n` bytes rounded up to a multiple of 256 (the alignment of every part of a device arena).
constexpr int64_t AlignUp(int64_t n) { return (n + 255) / 256 * 256; }

// cudaMalloc of max(bytes, 1) bytes. Errors: the CUDA error as a Status (cuda_status.h).
absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes);

// A non-blocking stream and two events: seconds between events recorded around an enqueue.
class EventTimer {
 public:
  // Errors: the CUDA error as a Status.
  static absl::StatusOr<EventTimer> Create();

  cudaStream_t stream() const { return stream_.get(); }

  // Records the start event, calls `enqueue()` (which returns absl::Status and enqueues work on
  // stream()), records the stop event, waits for it and returns the elapsed seconds. Errors: the
  // enqueue's Status, or a CUDA error.
  template <typename Fn>
  absl::StatusOr<double> Time(Fn&& enqueue) {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(start_.get(), stream_.get()));
    if (absl::Status s = enqueue(); !s.ok()) return s;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop_.get(), stream_.get()));
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop_.get()));
    float ms = 0;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_.get(), stop_.get()));
    return static_cast<double>(ms) * 1e-3;
  }

 private:
  Stream stream_;
  Event start_, stop_;
};

// Captures the work `enqueue()` (returning absl::Status) puts on `stream` into a CUDA graph and
// instantiates it. Errors: the enqueue's Status, or a CUDA error.
template <typename Fn>
absl::StatusOr<GraphExec> CaptureGraph(cudaStream_t stream, Fn&& enqueue) {
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status enqueued = enqueue();
  cudaGraph_t raw = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &raw);
  const Graph graph(raw);
  if (!enqueued.ok()) return enqueued;
  DEQUANTD_CUDA_RETURN_IF_ERROR(ended);
  cudaGraphExec_t exec = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph.get(), 0));
  return GraphExec(exec);
}

// Peak copy rate in bytes per second: median of 10 event-timed device-to-device cudaMemcpyAsync
// calls of `bytes` (after one untimed warm-up), counted as bytes read + written (2 * bytes).
// Errors: CUDA errors (allocation, copy, events) as Status.
absl::StatusOr<double> MeasurePeakCopy(EventTimer& timer, int64_t bytes);

}  // namespace dequantd::bench
