// The CUDA backend: one worker per GPU. The model's packed weights are uploaded once (Prepare)
// and stay resident; each request runs on a slot of its device (a stream, two pinned staging
// buffers) and streams its result device -> host in chunks, copying chunk i+1 while chunk i is
// handed to the sink. Compiled only when DEQUANTD_HAVE_CUDA.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/dequant.h"

namespace dequantd {

class Backend;

// Picks the launch configuration of one kernel call: the seam where the autotuner plugs in
// (a tuned-config cache lookup that tunes on a miss). `device` is the CUDA device ordinal.
// Called from many requests at once: must be thread-safe. Its error fails the request.
using LaunchConfigProvider = std::function<absl::StatusOr<cuda::LaunchConfig>(
    int device, cuda::KernelVariant variant, const AwqShape& shape, DType out_dtype)>;

struct CudaBackendOptions {
  cuda::KernelVariant variant = cuda::KernelVariant::kV4Vec16;  // the kernel every request runs
  LaunchConfigProvider launch_config;  // null: cuda::DefaultConfig(variant, shape, out_dtype)
  int slots_per_device = 4;            // requests in flight per GPU; further ones wait for a slot
  int64_t staging_bytes = int64_t{4} << 20;       // each of a slot's two pinned buffers, bytes
  int64_t buffer_cache_bytes = int64_t{2} << 30;  // idle device buffers kept per GPU, bytes
};

// Number of CUDA devices; 0 when there is no driver or no device.
int CudaDeviceCount();

// Creates the backend on every visible GPU. Errors: FAILED_PRECONDITION (no device),
// INVALID_ARGUMENT (bad options), RESOURCE_EXHAUSTED / INTERNAL from CUDA.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options);

}  // namespace dequantd
