// Device-side decode of compressed-tensors float-quantized FP8 (layer 1 of its kernels: no kernels
// here). The layout and the rounding rule come from kernels/compressed_tensors_fp8_format.h; the
// pieces are the other rows' device helpers, not copies: the E4M3 fp32 product is fp8_block's
// (fp8_block::Fp32Product), the scale load and the rounded store awq_decode.cuh's
// (LoadScaleAsFloat, StoreElement), round_sdt compressed-tensors' (RoundToScale of
// compressed_tensors_decode.cuh). Every helper reproduces
//   w[n, k] = round_out( round_sdt( float32(weight[n, k]) * float32(s[n / R, k / C]) ) )
// bit for bit: one fp32 multiply (no fused operation to contract with), then cvt.rn to the scale
// dtype (fp16/bf16 scales) and cvt.rn to the output dtype.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/compressed_tensors_fp8_format.h"
#include "kernels/cuda/awq_decode.cuh"                 // LoadScaleAsFloat, StoreElement
#include "kernels/cuda/compressed_tensors_decode.cuh"  // RoundToScale
#include "kernels/fp8_block_format.h"

namespace dequantd::cuda {

// Device pointers and shape of one compressed_tensors_fp8 launch (elements, not bytes).
struct CtFp8Params {
  const uint8_t* weight = nullptr;     // (N, K) E4M3
  const void* weight_scale = nullptr;  // (ceil(N/R), ceil(K/C)) fp32, bf16 or fp16
  void* out = nullptr;                 // (N, K), or (K, N) when !nk
  int64_t K = 0;
  int64_t N = 0;
  int64_t rows_per_scale = 1;  // R
  int64_t cols_per_scale = 1;  // C
  int64_t grid_cols = 0;       // ceil(K / C)
  bool nk = true;              // the result is (N, K)
};

// The scale covering weight element (n, k), as a float (exact).
template <DType kScale>
__device__ __forceinline__ float CtFp8Scale(const CtFp8Params& p, int64_t n, int64_t k) {
  return LoadScaleAsFloat<kScale>(
      p.weight_scale,
      compressed_tensors_fp8::ScaleIndex(n, k, p.rows_per_scale, p.cols_per_scale, p.grid_cols));
}

// w[n, k] before round_out, from the weight byte and its scale: round_sdt(fp32 product).
template <DType kScale>
__device__ __forceinline__ float CtFp8Element(uint8_t weight_bits, float s) {
  return RoundToScale<kScale>(fp8_block::Fp32Product(weight_bits, s));
}

}  // namespace dequantd::cuda
