// The device-to-device copy rate of a GPU, measured once at start for the observer.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/statusor.h"

namespace dequantd::cuda {

// Bytes read + written per second of the current device: one warm-up, then one event-timed
// cudaMemcpyAsync of 256 MiB on `stream`. 0 when the buffers do not fit. INTERNAL on CUDA errors.
absl::StatusOr<double> MeasureCopyBandwidth(cudaStream_t stream);

}  // namespace dequantd::cuda
