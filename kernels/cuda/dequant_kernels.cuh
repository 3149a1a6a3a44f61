// Kernel templates of the CUDA AWQ dequantizer (layer 2: variant and dtypes as template
// parameters; the host launcher in dequant_cuda.cu picks the instance). All indexing is 64-bit and
// every kernel walks its work with a grid-stride loop, so K * N past 2^31 (and grids past the
// 2^31 - 1 block limit) are fine.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/awq_decode.cuh"
#include "kernels/cuda/dequant_cuda.h"

namespace dequantd::cuda {

// Device pointers and shape of one launch (elements, not bytes).
struct DequantParams {
  const uint32_t* qweight = nullptr;  // (K, N/8)
  const uint32_t* qzeros = nullptr;   // (K/G, N/8)
  const void* scales = nullptr;       // (K/G, N) fp16 or bf16
  void* out = nullptr;                // (K, N) output dtype
  int64_t K = 0;
  int64_t N = 0;
  int64_t words_per_row = 0;  // N / 8
  int64_t group_size = 0;
};

__device__ __forceinline__ int64_t GlobalThreadIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// v1: one thread per output element (the baseline: 2-byte stores, each word re-read 8 times).
template <DType kScale, DType kOut>
__global__ void DequantPerElementKernel(DequantParams p) {
  const int64_t total = p.K * p.N;
  for (int64_t e = GlobalThreadIndex(); e < total; e += GridThreads()) {
    const int64_t k = e / p.N;
    const int64_t n = e - k * p.N;
    const int64_t g = k / p.group_size;
    const int64_t c = n / awq::kPackFactor;
    const int i = static_cast<int>(n - c * awq::kPackFactor);
    const uint32_t qword = __ldg(p.qweight + k * p.words_per_row + c);
    const uint32_t zword = __ldg(p.qzeros + g * p.words_per_row + c);
    const float s = LoadScaleAsFloat<kScale>(p.scales, g * p.N + n);
    StoreElement<kOut>(p.out, e, DequantElement(qword, zword, i, s));
  }
}

// v2 / v3: one thread per packed qweight word, 8 scalar outputs (the block size is the launcher's
// choice: fixed 256 for v2, LaunchConfig::block_size for v3).
template <DType kScale, DType kOut>
__global__ void DequantPerWordKernel(DequantParams p) {
  const int64_t total = p.K * p.words_per_row;
  for (int64_t w = GlobalThreadIndex(); w < total; w += GridThreads()) {
    const int64_t k = w / p.words_per_row;
    const int64_t c = w - k * p.words_per_row;
    const int64_t g = k / p.group_size;
    const uint32_t qword = __ldg(p.qweight + w);
    const uint32_t zword = __ldg(p.qzeros + g * p.words_per_row + c);
    const int64_t n0 = c * awq::kPackFactor;
#pragma unroll
    for (int i = 0; i < awq::kPackFactor; ++i) {
      const float s = LoadScaleAsFloat<kScale>(p.scales, g * p.N + n0 + i);
      StoreElement<kOut>(p.out, k * p.N + n0 + i, DequantElement(qword, zword, i, s));
    }
  }
}

// ---- v4_vec16 ---------------------------------------------------------------------------------

// Loads and stores of v4, with the cache hints chosen by measurement on the H200 (the quick bench
// in tests/cuda instantiates the alternatives). kWords consecutive 32-bit words are one 4-, 8- or
// 16-byte access; the caller guarantees alignment.
struct Vec16DefaultPolicy {
  // qweight is read once: streaming (evict-first) loads.
  template <int kWords>
  __device__ __forceinline__ static void LoadQweight(const uint32_t* p, uint32_t (&w)[kWords]) {
    LoadWords<kWords, /*kStreaming=*/true>(p, w);
  }
  // qzeros/scales are re-read by the other row blocks of the group: read-only cached loads.
  template <int kWords>
  __device__ __forceinline__ static void LoadQzeros(const uint32_t* p, uint32_t (&w)[kWords]) {
    LoadWords<kWords, /*kStreaming=*/false>(p, w);
  }
  __device__ __forceinline__ static uint4 LoadScales(const uint4* p) { return __ldg(p); }
  // The output is written once and not read back by this kernel: streaming stores.
  __device__ __forceinline__ static void Store(uint4* p, uint4 v) { __stcs(p, v); }

  template <int kWords, bool kStreaming>
  __device__ __forceinline__ static void LoadWords(const uint32_t* p, uint32_t (&w)[kWords]) {
    static_assert(kWords == 1 || kWords == 2 || kWords == 4);
    if constexpr (kWords == 4) {
      const uint4 v = kStreaming ? __ldcs(reinterpret_cast<const uint4*>(p))
                                 : __ldg(reinterpret_cast<const uint4*>(p));
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (kWords == 2) {
      const uint2 v = kStreaming ? __ldcs(reinterpret_cast<const uint2*>(p))
                                 : __ldg(reinterpret_cast<const uint2*>(p));
      w[0] = v.x, w[1] = v.y;
    } else {
      w[0] = kStreaming ? __ldcs(p) : __ldg(p);
    }
  }
};

// v4: each thread owns a tile of kRows consecutive rows (inside one group, so kRows divides
// group_size) by kWords consecutive packed words (kWords divides N/8). It issues every qweight load
// of the tile first, loads the group's zero words and scales once (16 bytes of scales per word),
// then writes each word's 8 outputs with 16-byte stores (two for fp32). Consecutive threads take
// consecutive word chunks of a row band, so loads and stores of a warp are contiguous.
// Requires 16-byte aligned scales and output, and for kWords > 1 qweight/qzeros aligned to
// 4 * kWords bytes.
template <DType kScale, DType kOut, int kWords, int kRows, class Policy = Vec16DefaultPolicy>
requires(kWords* kRows <= kV4MaxTileWords) __global__ void __launch_bounds__(kV4MaxBlockSize)
    DequantVec16Kernel(DequantParams p) {
  using Out = OutWord<kOut>;
  const int64_t chunks_per_row = p.words_per_row / kWords;
  const int64_t row_blocks_per_group = p.group_size / kRows;
  const int64_t units = (p.K / kRows) * chunks_per_row;
  for (int64_t u = GlobalThreadIndex(); u < units; u += GridThreads()) {
    const int64_t row_block = u / chunks_per_row;
    const int64_t c0 = (u - row_block * chunks_per_row) * kWords;
    const int64_t k0 = row_block * kRows;
    const int64_t g = row_block / row_blocks_per_group;

    uint32_t q[kRows][kWords];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      Policy::LoadQweight(p.qweight + (k0 + r) * p.words_per_row + c0, q[r]);
    uint32_t z[kWords];
    Policy::LoadQzeros(p.qzeros + g * p.words_per_row + c0, z);
    uint4 s[kWords];
    const uint4* scales = static_cast<const uint4*>(p.scales) + g * p.words_per_row + c0;
#pragma unroll
    for (int w = 0; w < kWords; ++w) s[w] = Policy::LoadScales(scales + w);

    uint4* out = static_cast<uint4*>(p.out);
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      const WordDequantizer<kScale, kOut> dequant(z[w], s[w]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const Out o = dequant(q[r][w]);
        const int64_t word_index = (k0 + r) * p.words_per_row + c0 + w;
#pragma unroll
        for (int v = 0; v < Out::kVectors; ++v)
          Policy::Store(out + word_index * Out::kVectors + v, o.v[v]);
      }
    }
  }
}

}  // namespace dequantd::cuda
