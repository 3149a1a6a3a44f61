// CHECK_CUDA for the command-line kernel tools (cuda_quick_bench, cuda_latency_probe): print the
// failed call with file:line and exit(1). Tests use Status-returning helpers instead.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(expr)                                                          \
  do {                                                                            \
    cudaError_t e_ = (expr);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s failed at %s:%d: %s\n", #expr, __FILE__, __LINE__, \
                   cudaGetErrorString(e_));                                       \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)
