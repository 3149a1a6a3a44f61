// One way to turn a CUDA runtime error into an absl::Status carrying the call and file:line.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dequantd::cuda {

// INTERNAL "cudaMalloc(&p, n) failed at file.cc:12: out of memory (cudaErrorMemoryAllocation)";
// cudaErrorMemoryAllocation maps to RESOURCE_EXHAUSTED. OK for cudaSuccess.
inline absl::Status CudaStatus(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(call, " failed at ", file, ":", line, ": ",
                                 cudaGetErrorString(err), " (", cudaGetErrorName(err), ")");
  return err == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(msg)
                                          : absl::InternalError(msg);
}

}  // namespace dequantd::cuda

#define DEQUANTD_CUDA_RETURN_IF_ERROR(expr)                                                 \
  do {                                                                                      \
    if (absl::Status _st = ::dequantd::cuda::CudaStatus((expr), #expr, __FILE__, __LINE__); \
        !_st.ok())                                                                          \
      return _st;                                                                           \
  } while (0)
