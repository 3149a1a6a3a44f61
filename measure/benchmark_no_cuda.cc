// The CUDA backend's entry points in builds without CUDA (compiled only then).
#include "measure/backends.h"

namespace dequantd::bench {

bool CudaDeviceAvailable(int) { return false; }

absl::StatusOr<BenchmarkResult> RunCudaBenchmark(const BenchmarkRequest&) {
  return absl::UnimplementedError("this build of dequantd has no CUDA");
}

}  // namespace dequantd::bench
