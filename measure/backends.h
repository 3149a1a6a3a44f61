// The backends behind RunBenchmark (measure/benchmark.h). Internal to bench/.
#pragma once

#include <random>

#include "absl/status/statusor.h"
#include "measure/benchmark.h"

namespace dequantd::bench {

// `request` is normalized by RunBenchmark: shapes validated with their group_size set, trials,
// runs, output_dtypes, peak_copy_bytes and seed filled in; variants not yet checked.
absl::StatusOr<BenchmarkResult> RunCpuBenchmark(const BenchmarkRequest& request);

// Whether this build has CUDA and `device` exists.
bool CudaDeviceAvailable(int device);

// As RunCpuBenchmark on CUDA device request.device. UNIMPLEMENTED in builds without CUDA.
absl::StatusOr<BenchmarkResult> RunCudaBenchmark(const BenchmarkRequest& request);

// The variants a backend offers, and the request's selection of them: INVALID_ARGUMENT naming
// an unknown one ("copy" is accepted and ignored: it is always measured).
absl::StatusOr<std::vector<std::string>> SelectVariants(const std::vector<std::string>& requested,
                                                        const std::vector<std::string>& offered);

}  // namespace dequantd::bench
