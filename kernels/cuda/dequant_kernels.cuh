// Kernel templates of the CUDA AWQ dequantizer (layer 2: variant and dtypes as template
// parameters; the host launcher in dequant_cuda.cu picks the instance). Addresses are 64-bit and
// every kernel walks its work with a grid-stride loop, so K * N past 2^31 (and grids past the
// 2^31 - 1 block limit) are fine.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/awq_decode.cuh"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/cuda/fast_divmod.h"
#include "kernels/cuda/launch_helpers.cuh"    // GlobalThreadIndex, GridThreads, LaunchProgrammatic
#include "kernels/cuda/row_chunk_kernel.cuh"  // kChunk, PackChunk

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
  bool nk = false;  // the result is (N, K) (Orientation::kNK), else (K, N)
};

// v1: one thread per output element (the baseline: 2-byte stores, each word re-read 8 times).
template <DType kScale, DType kOut>
__global__ void DequantPerElementKernel(DequantParams p) {
  const int64_t total = p.K * p.N;
  for (int64_t e = GlobalThreadIndex(); e < total; e += GridThreads()) {
    // e is the output index: (k, n) of a (K, N) result, (n, k) of an (N, K) one.
    const int64_t k = p.nk ? e % p.K : e / p.N;
    const int64_t n = p.nk ? e / p.K : e - k * p.N;
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
// choice: fixed 256 for v2, LaunchConfig::block_size for v3). For an (N, K) result consecutive
// threads take consecutive rows k of one word column (k fastest), so each of the word's eight
// stores is coalesced across the warp (output row 8c + i, consecutive k).
template <DType kScale, DType kOut>
__global__ void DequantPerWordKernel(DequantParams p) {
  const int64_t total = p.K * p.words_per_row;
  for (int64_t w = GlobalThreadIndex(); w < total; w += GridThreads()) {
    const int64_t k = p.nk ? w % p.K : w / p.words_per_row;
    const int64_t c = p.nk ? w / p.K : w - k * p.words_per_row;
    const int64_t g = k / p.group_size;
    const uint32_t qword = __ldg(p.qweight + k * p.words_per_row + c);
    const uint32_t zword = __ldg(p.qzeros + g * p.words_per_row + c);
    const int64_t n0 = c * awq::kPackFactor;
#pragma unroll
    for (int i = 0; i < awq::kPackFactor; ++i) {
      const float s = LoadScaleAsFloat<kScale>(p.scales, g * p.N + n0 + i);
      const int64_t at = p.nk ? (n0 + i) * p.K + k : k * p.N + n0 + i;
      StoreElement<kOut>(p.out, at, DequantElement(qword, zword, i, s));
    }
  }
}

// ---- v4_vec16 for an (N, K) result: a register and shared-memory transpose per tile ---------

// A tile is kAwqNkTileN = 64 result rows n (8 qweight word columns: 32 bytes of each qweight row
// read, one whole DRAM sector) by kAwqNkTileK<kOut> inputs k: 512 bytes of every result row (256
// fp16/bf16 or 128 fp32 values, kAwqNkRowChunks 16-byte chunks). A block has one thread per (word
// column, chunk) of the tile.
inline constexpr int kAwqNkTileWords = 8;
inline constexpr int kAwqNkTileN = kAwqNkTileWords * awq::kPackFactor;
inline constexpr int kAwqNkRowChunks = 32;
inline constexpr int kAwqNkBlock = kAwqNkTileWords * kAwqNkRowChunks;  // 256 threads
template <DType kOut>
inline constexpr int kAwqNkTileK = kAwqNkRowChunks* kChunk<kOut>;

// A layer's (N, K) tile grid, on the host (the one-layer launcher and the grouped layout): tiles
// along K for a result of `out` (kAwqNkTileK), and bands of kAwqNkTileN result rows for N / 8 =
// `words_per_row` word columns.
constexpr int64_t AwqNkTilesAlongK(int64_t K, DType out) {
  const int64_t tile_k = int64_t{kAwqNkRowChunks} * 16 / DTypeSize(out);
  return (K + tile_k - 1) / tile_k;
}
constexpr int64_t AwqNkBands(int64_t words_per_row) {
  return (words_per_row + kAwqNkTileWords - 1) / kAwqNkTileWords;
}
static_assert(AwqNkTilesAlongK(kAwqNkTileK<DType::kF16>, DType::kF16) == 1 &&
              AwqNkTilesAlongK(kAwqNkTileK<DType::kBF16> + 1, DType::kBF16) == 2 &&
              AwqNkTilesAlongK(kAwqNkTileK<DType::kF32>, DType::kF32) == 1 &&
              AwqNkTilesAlongK(kAwqNkTileK<DType::kF32> + 1, DType::kF32) == 2);

// One thread's inputs for one tile: kChunk<kOut> consecutive qweight words of one column (rows k
// to k + kChunk - 1; 0 past K) and the zero word and 8 scales of row k's group.
template <DType kOut>
struct AwqNkLoads {
  uint32_t q[kChunk<kOut>] = {};
  uint32_t zword = 0;
  uint4 scales = {};
};

// Component m (0..3) of a 16-byte vector; m is a constant after unrolling.
__device__ __forceinline__ uint32_t Component(const uint4& v, int m) {
  return m == 0 ? v.x : m == 1 ? v.y : m == 2 ? v.z : v.w;
}

// v4 with Orientation::kNK. Block b takes the 64 result rows of word columns [8 band, 8 band + 8),
// band = b / segments, and `tiles_per_block` consecutive tiles along K of segment b % segments
// (segments fastest: the blocks resident together write whole stretches of the same rows). Per
// tile, thread (w, q) = (tid % 8, tid / 8):
//  - loads the kChunk words of column 8 band + w at rows k = k0 + q kChunk ... (a warp reads 4
//    rows x 32 bytes: whole sectors), and the zero word and 16 bytes of scales of row k's group;
//  - decodes the words' values exactly as the (K, N) v4 kernel does (WordDequantizer: the same
//    arithmetic and rounding), one column pair of all kChunk words at a time, transposes them in
//    registers (PRMT) into chunks of kChunk consecutive k of result rows n = 8 (8 band + w) + i,
//    and puts chunk i in the shared tile at [8 w + i][q ^ w] (the XOR swizzle spreads a
//    quarter-warp's 16-byte stores, which share q and differ in w, over all banks); then issues
//    the next tile's loads, which stay in flight while this tile is stored;
//  - then warp v stores result rows 64 band + v + 8 j, lane l chunk l: 512 contiguous bytes per
//    store instruction (element stores instead when K is not a multiple of kChunk or `out` is not
//    16-byte aligned).
// A chunk's rows share one group when group_size % kChunk == 0 (every checkpoint); otherwise each
// element is decoded with its own row's group (v1's arithmetic, slow, for odd test shapes). Needs
// 16-byte aligned scales (the launcher checks). AwqNkTileBlock is block `block`'s work (blocks of
// kAwqNkBlock threads) in the kernel's shared `tile`, shared by the one-layer kernel below and
// the grouped launch (grouped_dequant.cu).
using AwqNkSharedTile = uint4[kAwqNkTileN][kAwqNkRowChunks];
template <DType kScale, DType kOut>
__device__ __forceinline__ void AwqNkTileBlock(const DequantParams& p, int64_t segments,
                                               int64_t tiles_per_block, int64_t block,
                                               AwqNkSharedTile& tile) {
  constexpr int kC = kChunk<kOut>;
  constexpr int kTileK = kAwqNkTileK<kOut>;
  const int tid = static_cast<int>(threadIdx.x);
  const int w = tid % kAwqNkTileWords;
  const int q = tid / kAwqNkTileWords;
  const int64_t segment = block % segments;
  const int64_t band = block / segments;
  const int64_t c = band * kAwqNkTileWords + w;  // this thread's word column
  const bool in_column = c < p.words_per_row;
  const int64_t tiles_k = (p.K + kTileK - 1) / kTileK;
  const int64_t t_end = min(tiles_k, (segment + 1) * tiles_per_block);
  const bool uniform_groups = p.group_size % kC == 0;
  const bool chunked = p.K % kC == 0 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
  const auto* scales = static_cast<const uint16_t*>(p.scales);
  const auto group_inputs = [&](int64_t g, uint32_t& zword, uint4& s) {
    zword = __ldg(p.qzeros + g * p.words_per_row + c);
    s = __ldg(reinterpret_cast<const uint4*>(scales + g * p.N + c * awq::kPackFactor));
  };
  const auto load = [&](int64_t t, AwqNkLoads<kOut>& in) {
    const int64_t k = t * kTileK + q * kC;
    if (!in_column || k >= p.K) return;
#pragma unroll
    for (int j = 0; j < kC; ++j)
      in.q[j] = k + j < p.K ? __ldcs(p.qweight + (k + j) * p.words_per_row + c) : 0u;
    group_inputs(k / p.group_size, in.zword, in.scales);
  };

  int64_t t = segment * tiles_per_block;
  AwqNkLoads<kOut> in;
  if (t < t_end) load(t, in);
  for (; t < t_end; ++t) {
    const int64_t k0 = t * kTileK;
    const int64_t k = k0 + q * kC;
    uint4* const row = &tile[w * awq::kPackFactor][0];  // this thread's 8 result rows
    const int at = q ^ w;                               // its chunk in each, swizzled
    if (in_column && k < p.K && uniform_groups) {
      // Column pairs (2m, 2m + 1) of the kC words (WordDequantizer: v4's arithmetic), then the
      // two chunks of kC consecutive k they hold.
      const WordDequantizer<kScale, kOut> dq(in.zword, in.scales);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        typename WordDequantizer<kScale, kOut>::PairOut pair[kC];
#pragma unroll
        for (int j = 0; j < kC; ++j) pair[j] = dq.Pair(in.q[j], m);
        if constexpr (kOut == DType::kF32) {
          row[(2 * m) * kAwqNkRowChunks + at] =
              make_uint4(__float_as_uint(pair[0].x), __float_as_uint(pair[1].x),
                         __float_as_uint(pair[2].x), __float_as_uint(pair[3].x));
          row[(2 * m + 1) * kAwqNkRowChunks + at] =
              make_uint4(__float_as_uint(pair[0].y), __float_as_uint(pair[1].y),
                         __float_as_uint(pair[2].y), __float_as_uint(pair[3].y));
        } else {  // PRMT: the low halves (column 2m) of rows (j, j + 1), then the high halves
          row[(2 * m) * kAwqNkRowChunks + at] = make_uint4(
              __byte_perm(pair[0], pair[1], 0x5410u), __byte_perm(pair[2], pair[3], 0x5410u),
              __byte_perm(pair[4], pair[5], 0x5410u), __byte_perm(pair[6], pair[7], 0x5410u));
          row[(2 * m + 1) * kAwqNkRowChunks + at] = make_uint4(
              __byte_perm(pair[0], pair[1], 0x7632u), __byte_perm(pair[2], pair[3], 0x7632u),
              __byte_perm(pair[4], pair[5], 0x7632u), __byte_perm(pair[6], pair[7], 0x7632u));
        }
      }
    } else if (in_column && k < p.K) {
      // A group size that is not a multiple of kC: each element with its own row's group, v1's
      // arithmetic and rounding (rows past K are never stored; they repeat row K - 1's group).
#pragma unroll 1
      for (int i = 0; i < awq::kPackFactor; ++i) {
        uint32_t bits[kC];
#pragma unroll
        for (int j = 0; j < kC; ++j) {
          const int64_t g = min(k + j, p.K - 1) / p.group_size;
          const uint32_t zword = __ldg(p.qzeros + g * p.words_per_row + c);
          const float s = LoadScaleAsFloat<kScale>(p.scales, g * p.N + c * awq::kPackFactor + i);
          bits[j] = RoundBits<kOut>(DequantElement(in.q[j], zword, i, s));
        }
        row[i * kAwqNkRowChunks + at] = PackBits<kOut>(bits);
      }
    }
    if (t + 1 < t_end) load(t + 1, in);  // in flight while this tile is stored
    __syncthreads();                     // the tile decoded
    const int lane = tid % 32;
    const int64_t ks = k0 + lane * kC;  // this lane's chunk of every row
    for (int r = tid / 32; r < kAwqNkTileN; r += kAwqNkBlock / 32) {
      const int64_t n = band * kAwqNkTileN + r;
      if (n >= p.N || ks >= p.K) break;  // rows ascend with r
      const uint4 chunk = tile[r][lane ^ (r / awq::kPackFactor)];
      if (chunked) {
        __stcs(static_cast<uint4*>(p.out) + (n * p.K + ks) / kC, chunk);
      } else {
#pragma unroll
        for (int e = 0; e < kC; ++e) {
          if (ks + e >= p.K) break;
          if constexpr (kOut == DType::kF32) {
            static_cast<uint32_t*>(p.out)[n * p.K + ks + e] = Component(chunk, e);
          } else {
            static_cast<uint16_t*>(p.out)[n * p.K + ks + e] =
                static_cast<uint16_t>(Component(chunk, e / 2) >> (16 * (e % 2)));
          }
        }
      }
    }
    __syncthreads();  // the tile stored: free for the next decode
  }
}

// One layer's (N, K) result: block b is AwqNkTileBlock's block b. Programmatic dependent launch as
// DequantVec16Kernel.
template <DType kScale, DType kOut>
__global__ void __launch_bounds__(kAwqNkBlock)
    AwqNkTileKernel(DequantParams p, int64_t segments, int64_t tiles_per_block) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  __shared__ AwqNkSharedTile tile;
  AwqNkTileBlock<kScale, kOut>(p, segments, tiles_per_block, static_cast<int64_t>(blockIdx.x),
                               tile);
}

// Launches AwqNkTileKernel with `tiles_per_block` tiles along K per block (one block per segment
// of every band of 64 result rows), as a programmatic dependent launch when `pdl`.
template <DType kScale, DType kOut>
cudaError_t LaunchAwqNkTiles(const DequantParams& p, int64_t tiles_per_block, bool pdl,
                             cudaStream_t stream) {
  const int64_t tiles_k = AwqNkTilesAlongK(p.K, kOut);
  const int64_t bands = AwqNkBands(p.words_per_row);
  const int64_t segments = (tiles_k + tiles_per_block - 1) / tiles_per_block;
  if (bands * segments == 0) return cudaSuccess;
  if (bands * segments > int64_t{0x7FFFFFFF}) return cudaErrorInvalidConfiguration;
  return LaunchProgrammatic(AwqNkTileKernel<kScale, kOut>, bands * segments, kAwqNkBlock, pdl,
                            stream, p, segments, tiles_per_block);
}

// ---- v4_vec16 ---------------------------------------------------------------------------------

// One v4 launch: a slab of whole groups whose thread count fits in 31 bits, so every index
// division is a 32-bit FastDivmod (the launcher splits larger layers into several launches).
// Pointers are already offset to the slab's first row/group.
struct Vec16Params {
  DequantParams p;              // K = rows of this slab
  uint32_t units = 0;           // threads of work: (K / rows) * (N / 8 / words) * lanes < 2^31
  uint32_t chunks_per_row = 0;  // N / 8 / words: word stride between a thread's words
  FastDivmod by_chunks;         // divides by chunks_per_row * lanes per word
  FastDivmod by_row_blocks;     // divides by group_size / rows (row blocks per group)
};

// Loads and stores of v4, with the cache hints chosen by measurement on the H200 (the quick bench
// in tests/cuda instantiates the alternatives).
struct Vec16DefaultPolicy {
  // qweight is read once: streaming (evict-first) loads.
  __device__ __forceinline__ static uint32_t LoadQweight(const uint32_t* p) { return __ldcs(p); }
  // qzeros/scales are re-read by the other row blocks of the group: read-only cached loads.
  __device__ __forceinline__ static uint32_t LoadQzeros(const uint32_t* p) { return __ldg(p); }
  __device__ __forceinline__ static uint4 LoadScales(const uint4* p) { return __ldg(p); }
  // The output is written once and not read back by this kernel: streaming stores.
  __device__ __forceinline__ static void Store(uint4* p, uint4 v) { __stcs(p, v); }
};

// The inputs of one v4 work unit: kRows rows x kWords words of qweight, and the group's zero words
// and scales for those kWords words.
template <int kWords, int kRows>
struct Vec16Tile {
  int64_t k0;     // first row
  uint32_t c0;    // first word column; the others are c0 + w * chunks_per_row
  uint32_t half;  // fp32 output: which 16-byte half of each word's 32 output bytes (else 0)
  uint32_t q[kRows][kWords];
  uint32_t z[kWords];
  uint4 s[kWords];
};

// Threads per packed word: two for fp32 output (each stores one of the word's two 16-byte
// vectors, so a warp's store instruction covers 512 consecutive bytes), else one.
template <DType kOut>
inline constexpr int kVec16LanesPerWord = kOut == DType::kF32 ? 2 : 1;

template <DType kOut, int kWords, int kRows, class Policy>
__device__ __forceinline__ void LoadVec16Tile(const Vec16Params& v, uint32_t u,
                                              Vec16Tile<kWords, kRows>& t) {
  constexpr uint32_t kLanes = kVec16LanesPerWord<kOut>;
  const DequantParams& p = v.p;
  const uint32_t row_block = v.by_chunks.Div(u);  // divides by chunks_per_row * kLanes
  const uint32_t lane_chunk = u - row_block * v.chunks_per_row * kLanes;
  t.c0 = lane_chunk / kLanes;
  t.half = lane_chunk % kLanes;
  const uint32_t g = v.by_row_blocks.Div(row_block);
  t.k0 = static_cast<int64_t>(row_block) * kRows;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const uint32_t* row = p.qweight + (t.k0 + r) * p.words_per_row + t.c0;
#pragma unroll
    for (int w = 0; w < kWords; ++w) t.q[r][w] = Policy::LoadQweight(row + w * v.chunks_per_row);
  }
  const int64_t group_word0 = static_cast<int64_t>(g) * p.words_per_row + t.c0;
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    t.z[w] = Policy::LoadQzeros(p.qzeros + group_word0 + w * v.chunks_per_row);
    t.s[w] = Policy::LoadScales(static_cast<const uint4*>(p.scales) + group_word0 +
                                w * v.chunks_per_row);
  }
}

template <DType kScale, DType kOut, int kWords, int kRows, class Policy>
__device__ __forceinline__ void StoreVec16Tile(const Vec16Params& v,
                                               const Vec16Tile<kWords, kRows>& t) {
  using Out = OutWord<kOut>;
  static_assert(Out::kVectors == kVec16LanesPerWord<kOut>);
  uint4* out = static_cast<uint4*>(v.p.out);
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    const WordDequantizer<kScale, kOut> dequant(t.z[w], t.s[w]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const Out o = dequant(t.q[r][w]);
      const int64_t word_index = (t.k0 + r) * v.p.words_per_row + t.c0 + w * v.chunks_per_row;
      if constexpr (Out::kVectors == 1) {
        Policy::Store(out + word_index, o.v[0]);
      } else {
        Policy::Store(out + word_index * 2 + t.half, t.half ? o.v[1] : o.v[0]);
      }
    }
  }
}

// v4: a work unit is kRows consecutive rows (inside one group: kRows divides group_size) by kWords
// packed words of a row, spread at a stride of N/8/kWords words, so every load and store
// instruction of a warp touches consecutive addresses (4-byte qweight loads, 16-byte scale loads,
// 16-byte output stores; for fp32 output two threads share a word, one 16-byte half each). The
// group's zero words and scales are loaded once per unit. A thread walks its units with a
// grid-stride loop and loads unit i+1 before it converts and stores unit i, so loads stay in flight
// when the grid is smaller than the work. Programmatic dependent launch: the kernel waits for the
// preceding grid (griddepcontrol.wait, a no-op without PDL) before touching memory, and lets the
// next grid launch at once. Requires 16-byte aligned scales and output.
template <DType kScale, DType kOut, int kWords, int kRows, class Policy = Vec16DefaultPolicy>
requires(kWords* kRows <= kV4MaxTileWords) __global__ void __launch_bounds__(kV4MaxBlockSize)
    DequantVec16Kernel(Vec16Params v) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  const uint32_t stride = gridDim.x * blockDim.x;
  uint32_t u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= v.units) return;
  Vec16Tile<kWords, kRows> tile;
  LoadVec16Tile<kOut, kWords, kRows, Policy>(v, u, tile);
  while (true) {
    const uint32_t next = u + stride;  // < 2^32: u and stride are below 2^31
    const bool more = next < v.units;
    Vec16Tile<kWords, kRows> next_tile;
    if (more) LoadVec16Tile<kOut, kWords, kRows, Policy>(v, next, next_tile);
    StoreVec16Tile<kScale, kOut, kWords, kRows, Policy>(v, tile);
    if (!more) break;
    tile = next_tile;
    u = next;
  }
}

// Host side of a v4 launch (shared by the library launcher and the quick bench): splits the layer
// into slabs of whole groups of fewer than 2^31 threads each and launches
// DequantVec16Kernel<..., Policy> on each with `block_size` threads per block and at most
// `max_blocks` blocks (0: one thread per unit of work), as a programmatic dependent launch when
// `pdl`. CanImplement has checked that one group fits in a slab. Returns the first launch error.
template <DType kScale, DType kOut, int kWords, int kRows, class Policy = Vec16DefaultPolicy>
cudaError_t LaunchVec16(const DequantParams& p, int block_size, int64_t max_blocks, bool pdl,
                        cudaStream_t stream) {
  constexpr int64_t kMaxUnits = (int64_t{1} << 31) - 1;
  constexpr int kLanes = kVec16LanesPerWord<kOut>;
  const int64_t chunks_per_row = p.words_per_row / kWords;
  const int64_t units_per_group = p.group_size / kRows * chunks_per_row * kLanes;
  const int64_t groups = p.K / p.group_size;
  const int64_t groups_per_slab = std::max<int64_t>(1, kMaxUnits / units_per_group);
  Vec16Params v;
  v.chunks_per_row = static_cast<uint32_t>(chunks_per_row);
  v.by_chunks = FastDivmod::Make(v.chunks_per_row * kLanes);
  v.by_row_blocks = FastDivmod::Make(static_cast<uint32_t>(p.group_size / kRows));
  for (int64_t g0 = 0; g0 < groups; g0 += groups_per_slab) {
    const int64_t slab_groups = std::min(groups_per_slab, groups - g0);
    const int64_t k0 = g0 * p.group_size;
    v.p = p;
    v.p.K = slab_groups * p.group_size;
    v.p.qweight = p.qweight + k0 * p.words_per_row;
    v.p.qzeros = p.qzeros + g0 * p.words_per_row;
    v.p.scales = static_cast<const uint16_t*>(p.scales) + g0 * p.N;
    v.p.out = static_cast<char*>(p.out) + k0 * p.N * DTypeSize(kOut);
    const int64_t units = slab_groups * units_per_group;
    v.units = static_cast<uint32_t>(units);
    int64_t blocks = (units + block_size - 1) / block_size;
    if (max_blocks > 0) blocks = std::min(blocks, max_blocks);
    if (cudaError_t err =
            LaunchProgrammatic(DequantVec16Kernel<kScale, kOut, kWords, kRows, Policy>, blocks,
                               block_size, pdl, stream, v);
        err != cudaSuccess)
      return err;
  }
  return cudaSuccess;
}

}  // namespace dequantd::cuda
