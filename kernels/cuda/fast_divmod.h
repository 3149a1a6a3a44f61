// Division of 32-bit unsigned integers below 2^31 by a run-time constant, with a multiplier and
// shift computed once on the host (Granlund and Montgomery, "Division by invariant integers using
// multiplication", PLDI 1994; the form CUTLASS's FastDivmod uses). Host and device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DEQUANTD_FAST_DIVMOD_HD __host__ __device__ __forceinline__
#else
#define DEQUANTD_FAST_DIVMOD_HD inline
#endif

namespace dequantd::cuda {

// Fixed divisor d in [1, 2^31); Div(x) == x / d for every x in [0, 2^31).
struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 0;  // ceil(2^(31 + ceil(log2 d)) / d); unused for d == 1
  uint32_t shift = 0;       // ceil(log2 d) - 1

  static FastDivmod Make(uint32_t d) {
    FastDivmod f;
    f.divisor = d;
    if (d > 1) {
      uint32_t log2_ceil = 0;
      while ((uint64_t{1} << log2_ceil) < d) ++log2_ceil;
      const uint32_t p = 31 + log2_ceil;
      f.multiplier = static_cast<uint32_t>(((uint64_t{1} << p) + d - 1) / d);
      f.shift = p - 32;
    }
    return f;
  }

  DEQUANTD_FAST_DIVMOD_HD uint32_t Div(uint32_t x) const {
    if (divisor == 1) return x;
#if defined(__CUDA_ARCH__)
    return __umulhi(x, multiplier) >> shift;
#else
    return static_cast<uint32_t>((static_cast<uint64_t>(x) * multiplier) >> 32) >> shift;
#endif
  }
};

}  // namespace dequantd::cuda
