// Device allocation, the event timer and the copy yardstick (see cuda_timing.h).
#include "measure/cuda_timing.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "measure/stats.h"

namespace dequantd::bench {

absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes) {
  void* p = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
  return DeviceBuffer(p);
}

absl::StatusOr<SelectedDevice> SelectDevice(int device) {
  SelectedDevice d;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&d.prop, device));
  DEQUANTD_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, device));
  return d;
}

absl::StatusOr<EventTimer> EventTimer::Create() {
  EventTimer t;
  cudaStream_t s = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  t.stream_.reset(s);
  for (Event* e : {&t.start_, &t.stop_}) {
    cudaEvent_t raw = nullptr;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&raw));
    e->reset(raw);
  }
  return t;
}

absl::StatusOr<double> MeasurePeakCopy(EventTimer& timer, int64_t bytes) {
  absl::StatusOr<DeviceBuffer> src = Allocate(bytes);
  if (!src.ok()) return src.status();
  absl::StatusOr<DeviceBuffer> dst = Allocate(bytes);
  if (!dst.ok()) return dst.status();
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src->get(), 0x5A, bytes, timer.stream()));
  auto copy = [&]() -> absl::Status {
    DEQUANTD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst->get(), src->get(), bytes, cudaMemcpyDeviceToDevice, timer.stream()));
    return absl::OkStatus();
  };
  if (absl::StatusOr<double> warm = timer.Time(copy); !warm.ok()) return warm.status();
  std::vector<double> samples;
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<double> t = timer.Time(copy);
    if (!t.ok()) return t.status();
    samples.push_back(*t);
  }
  return 2.0 * static_cast<double>(bytes) / ComputeStats(samples).median;
}

}  // namespace dequantd::bench
