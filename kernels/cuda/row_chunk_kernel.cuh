// The kernel that the formats whose stored rows run along the result's rows share (layer 2, no
// format knowledge here): compressed-tensors int and FP8, FP8 block-scaled and MXFP4 in (N, K),
// where a result row n is made from stored row n alone. A format supplies a decoder, a struct with
//   using Params = ...;  // its launch parameters, with a `void* out` member
//   template <DType kOut>
//   static __device__ uint4 Chunk(const Params& p, int64_t row, int64_t col0);
// which returns result elements [col0, col0 + kChunk<kOut>) of result row `row` as one 16-byte
// vector, each rounded once to kOut (its own rounding rule: PackChunk for cvt.rn). col0 is a
// multiple of kChunk<kOut>.
//
// Work split (what made AWQ's v4 reach the copy rate, kernels/cuda/NOTES.md): a 32 x 8 thread
// block takes 32 consecutive result rows and 32 consecutive chunks of each, so every warp store
// instruction writes 512 contiguous bytes of one row and the block reads neighbouring stored
// rows. One tile per block (a grid-stride loop only past 65535 row tiles); no division in the
// kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/dtype.h"

namespace dequantd::cuda {

// Result elements per 16-byte chunk: 8 fp16/bf16 or 4 fp32.
template <DType kOut>
inline constexpr int kChunk = kOut == DType::kF32 ? 4 : 8;

// round_out(v)'s bits (cvt.rn, round to nearest even): 16 bits for fp16/bf16, 32 for fp32.
template <DType kOut>
__device__ __forceinline__ uint32_t RoundBits(float v) {
  if constexpr (kOut == DType::kF16) {
    return __half_as_ushort(__float2half_rn(v));
  } else if constexpr (kOut == DType::kBF16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else {
    static_assert(kOut == DType::kF32);
    return __float_as_uint(v);
  }
}

// kChunk<kOut> rounded results' bits in memory order as one 16-byte vector.
template <DType kOut>
__device__ __forceinline__ uint4 PackBits(const uint32_t (&b)[kChunk<kOut>]) {
  if constexpr (kOut == DType::kF32) {
    return make_uint4(b[0], b[1], b[2], b[3]);
  } else {
    return make_uint4(b[0] | b[1] << 16, b[2] | b[3] << 16, b[4] | b[5] << 16, b[6] | b[7] << 16);
  }
}

// Two fp32 values rounded once to fp16/bf16 (cvt.rn, the same rounding as RoundBits) in one
// instruction (cvt.rn.f16x2.f32 / cvt.rn.bf16x2.f32), a in the low half: half the conversions,
// which bound these kernels' issue rate.
template <DType kOut>
__device__ __forceinline__ uint32_t PackPair(float a, float b) {
  static_assert(kOut == DType::kF16 || kOut == DType::kBF16);
  if constexpr (kOut == DType::kF16) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// kChunk<kOut> fp32 values, each rounded once with cvt.rn, as one 16-byte vector.
template <DType kOut>
__device__ __forceinline__ uint4 PackChunk(const float (&v)[kChunk<kOut>]) {
  if constexpr (kOut == DType::kF32) {
    return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]),
                      __float_as_uint(v[3]));
  } else {
    return make_uint4(PackPair<kOut>(v[0], v[1]), PackPair<kOut>(v[2], v[3]),
                      PackPair<kOut>(v[4], v[5]), PackPair<kOut>(v[6], v[7]));
  }
}

inline constexpr int kRowChunkThreads = 256;  // consecutive chunks of one row per block

// The result's geometry: `rows` rows of `row_chunks` chunks.
struct RowChunkGrid {
  int64_t rows = 0;
  int64_t row_chunks = 0;
};

// Block (x, y): chunks [256 x, 256 x + 256) of rows [kRows y, kRows y + kRows), one chunk of each
// row per thread, decoded before any is stored (their loads in flight together). Blocks are
// dispatched x first, so the grid sweeps the result in address order, as a copy does.
template <class Decoder, DType kOut, int kRows>
__global__ void __launch_bounds__(kRowChunkThreads)
    RowChunkKernel(typename Decoder::Params p, RowChunkGrid grid) {
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * kRowChunkThreads + threadIdx.x;
  if (chunk >= grid.row_chunks) return;
  auto* out = static_cast<uint4*>(p.out);
  for (int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRows; row0 < grid.rows;
       row0 += static_cast<int64_t>(gridDim.y) * kRows) {
    uint4 v[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (row0 + r < grid.rows)
        v[r] = Decoder::template Chunk<kOut>(p, row0 + r, chunk * kChunk<kOut>);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (row0 + r < grid.rows) out[(row0 + r) * grid.row_chunks + chunk] = v[r];
    }
  }
}

// Launches RowChunkKernel<Decoder, kOut, kRows> over a result of `rows` x `cols` elements: grid x
// the 256-chunk pieces of a row, grid y the kRows-row bands (at most 65535 blocks, then a
// grid-stride loop). The caller has checked ChunkAligned(p.out, cols, kOut).
template <class Decoder, DType kOut, int kRows = 2>
absl::Status LaunchRowChunks(const typename Decoder::Params& p, int64_t rows, int64_t cols,
                             cudaStream_t stream) {
  const RowChunkGrid grid{.rows = rows, .row_chunks = cols / kChunk<kOut>};
  if (grid.rows == 0 || grid.row_chunks == 0) return absl::OkStatus();
  const int64_t x = (grid.row_chunks + kRowChunkThreads - 1) / kRowChunkThreads;
  const int64_t y = std::min<int64_t>((grid.rows + kRows - 1) / kRows, 65535);
  if (x > int64_t{0x7FFFFFFF}) return absl::InvalidArgumentError("result rows are too long");
  RowChunkKernel<Decoder, kOut, kRows>
      <<<dim3(static_cast<unsigned>(x), static_cast<unsigned>(y)), kRowChunkThreads, 0, stream>>>(
          p, grid);
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// Whether a result of `cols` columns of kOut at `out` can be stored in whole 16-byte chunks.
inline bool ChunkAligned(const void* out, int64_t cols, DType out_dtype) {
  const int64_t chunk = out_dtype == DType::kF32 ? 4 : 8;
  return reinterpret_cast<uintptr_t>(out) % 16 == 0 && cols % chunk == 0;
}

}  // namespace dequantd::cuda
