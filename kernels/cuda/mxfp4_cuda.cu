// MXFP4's CUDA kernels (layer 2), their host launcher (layer 3) and its FormatKernels row entry
// (kernels/cuda/format_kernels.h). Two variants, either orientation, experts stacked:
//   v1_per_element: one thread per output element, in output order (coalesced stores);
//   v4_vec16:       16-byte aligned blocks and out, and whole 16-byte result chunks per row:
//                   (E, N, K) runs RowChunkKernel (row_chunk_kernel.cuh) over the E*N rows, one
//                   thread per 16-byte chunk (one 4- or 2-byte load of blocks, one scale, one
//                   16-byte store); (E, K, N) (N % chunk == 0) a shared-memory transpose
//                   (Mxfp4KnTileKernel) whose tile shape is the launch configuration the
//                   autotuner chooses. Other shapes run v1's loop.
// v1 and (E, N, K) v4 take no launch parameters (64-bit indices, grid-stride loops). Every path
// computes mxfp4::Element and rounds it once (mxfp4_decode.cuh). (A register-transpose (E, K, N)
// kernel with packed multiplies was measured slower, 2026-12-05: kernels/cuda/NOTES.md.)
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/cuda/format_kernels.h"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/cuda/mxfp4_decode.cuh"
#include "kernels/cuda/row_chunk_kernel.cuh"
#include "kernels/mxfp4_format.h"

namespace dequantd::cuda {
namespace {

constexpr int kBlockThreads = 256;

template <DType kOut>
__global__ void Mxfp4PerElementKernel(Mxfp4Params p) {
  const int64_t per_expert = p.K * p.N;
  const int64_t total = p.experts * per_expert;
  for (int64_t i = GlobalThreadIndex(); i < total; i += GridThreads()) {
    int64_t row;  // blocks row e*N + n
    int64_t k;
    if (p.nk) {
      row = i / p.K;
      k = i % p.K;
    } else {
      const int64_t e = i / per_expert;
      const int64_t kn = i % per_expert;
      k = kn / p.N;
      row = e * p.N + kn % p.N;
    }
    const uint8_t byte = __ldg(p.blocks + row * (p.K / 2) + k / 2);
    const uint8_t s = __ldg(p.scales + row * p.groups + k / mxfp4::kBlockValues);
    StoreMxfp4<kOut>(p.out, i, mxfp4::Element(mxfp4::NibbleOf(byte, k), s));
  }
}

// (E, N, K) chunks for RowChunkKernel over the E*N block rows: result row r (expert r / N, row
// r % N), columns [k0, k0 + kChunk) from one 4-byte (fp16/bf16) or 2-byte (fp32) load of blocks
// and the scale of their 32-value block. Needs 16-byte aligned blocks (then every chunk's bytes
// are aligned: K / 2 is a multiple of 16).
struct Mxfp4NkChunks {
  using Params = Mxfp4Params;
  template <DType kOut>
  static __device__ __forceinline__ uint4 Chunk(const Params& p, int64_t row, int64_t k0) {
    constexpr int kValues = kChunk<kOut>;
    const uint8_t s = __ldg(p.scales + row * p.groups + k0 / mxfp4::kBlockValues);
    const uint8_t* src = p.blocks + row * (p.K / 2) + k0 / 2;
    uint32_t bytes;
    if constexpr (kValues == 8) {
      bytes = __ldg(reinterpret_cast<const unsigned*>(src));
    } else {
      bytes = __ldg(reinterpret_cast<const unsigned short*>(src));
    }
    if (s != mxfp4::kScaleNan) {
      const float scale = mxfp4::ScaleToFloat(s);
      float v[kValues];
#pragma unroll
      for (int i = 0; i < kValues / 2; ++i) {
        const float2 pair = ByteValues((bytes >> (8 * i)) & 0xFFu, scale);
        v[2 * i] = pair.x;
        v[2 * i + 1] = pair.y;
      }
      return PackChunk<kOut>(v);
    }
    // Scale 0xFF: NaNs (inf * 0), which take the host conversion's bits (RoundOutBits).
    uint32_t bits[kValues];
#pragma unroll
    for (int j = 0; j < kValues; ++j) {
      const auto byte = static_cast<uint8_t>(bytes >> (8 * (j / 2)));
      bits[j] = RoundOutBits<kOut>(mxfp4::Element(mxfp4::NibbleOf(byte, j), s));
    }
    return PackBits<kOut>(bits);
  }
};

// (E, K, N): the packed blocks are staged in shared memory and transposed in registers. A tile
// (Mxfp4KnTile, its shape the launch configuration) is kG blocks (32 inputs k each) of kRows rows
// n of one expert; tiles are numbered n first.
//   Load: the tile's kRows runs of 16 kG bytes (one per block row) and their scales go to shared
//   memory, consecutive lanes reading consecutive 16-byte pieces of a run.
//   Store: a thread takes one 32-bit word (8 inputs k, one scale) of each of 8 neighbouring rows n
//   and writes the 8 result rows k of those 8 columns (one 16-byte chunk per row for fp16 / bf16,
//   two for fp32); the lanes of a warp take neighbouring rows, so each warp store covers 512
//   contiguous bytes of a result row (fp32: two stores, 1024). Each value is rounded once.
// Word w of row r is kept at column w ^ Swizzle(r) (a multiple of kLanesK below 32): the lanes of
// a store-phase load, rows 8 t + i and words w0 + h, then hit 32 banks.
template <DType kOut, int kG, int kRows>
struct Mxfp4KnTile {
  static constexpr int kThreads = 256;
  static constexpr int kWords = 4 * kG;                            // 32-bit words of a tile row
  static constexpr int kLanesN = kRows / 8 < 32 ? kRows / 8 : 32;  // row octets per warp
  static constexpr int kLanesK = 32 / kLanesN;                     // words per warp
  static constexpr int kSharedBytes = kRows * kWords * 4 + kRows * kG;  // blocks, scales
  static_assert(kWords >= 32, "the swizzle stays within a row");
  static_assert(kRows % 8 == 0 && kRows >= 32 && (kRows * kG) % kThreads == 0);
  static_assert((kRows / 8) * kWords % kThreads == 0);
  static __device__ __forceinline__ int Swizzle(int r) { return (r / 8) % kLanesN * kLanesK; }
};

template <DType kOut, int kG, int kRows>
__global__ void __launch_bounds__(256) Mxfp4KnTileKernel(Mxfp4Params p) {
  using T = Mxfp4KnTile<kOut, kG, kRows>;
  extern __shared__ __align__(16) uint32_t tile[];  // [kRows][kWords] swizzled, then scales
  uint8_t* tile_scales = reinterpret_cast<uint8_t*>(tile + kRows * T::kWords);  // [kRows][kG]
  const int64_t tiles_n = (p.N + kRows - 1) / kRows;
  const int64_t tiles_g = (p.groups + kG - 1) / kG;
  const int64_t t = blockIdx.x;
  const int64_t e = t / (tiles_g * tiles_n);
  const int64_t g0 = t / tiles_n % tiles_g * kG;
  const int64_t n0 = t % tiles_n * kRows;
  const int blocks_here = static_cast<int>(std::min<int64_t>(kG, p.groups - g0));
  const int rows_here = static_cast<int>(std::min<int64_t>(kRows, p.N - n0));
  const int tx = static_cast<int>(threadIdx.x);
  const int64_t row0 = e * p.N + n0;  // the tile's first block row

  // Load: piece i = (row r, block g), g fastest; every load issued before any shared store.
  constexpr int kPieces = kRows * kG / T::kThreads;
  uint4 piece[kPieces];
#pragma unroll
  for (int j = 0; j < kPieces; ++j) {
    const int i = tx + j * T::kThreads;
    const int r = i / kG;
    const int g = i % kG;
    if (r < rows_here && g < blocks_here) {
      piece[j] = __ldg(reinterpret_cast<const uint4*>(p.blocks) + (row0 + r) * p.groups + g0 + g);
      tile_scales[r * kG + g] = __ldg(p.scales + (row0 + r) * p.groups + g0 + g);
    }
  }
#pragma unroll
  for (int j = 0; j < kPieces; ++j) {
    const int i = tx + j * T::kThreads;
    const int r = i / kG;
    const int g = i % kG;
    uint32_t* row = tile + r * T::kWords;
    const int sw = T::Swizzle(r);
    row[(4 * g + 0) ^ sw] = piece[j].x;
    row[(4 * g + 1) ^ sw] = piece[j].y;
    row[(4 * g + 2) ^ sw] = piece[j].z;
    row[(4 * g + 3) ^ sw] = piece[j].w;
  }
  __syncthreads();

  // Store: item = (row octet o, word w); a warp's lanes take kLanesN octets x kLanesK words.
  const int64_t out_row = p.N / kChunk<kOut>;  // 16-byte chunks per result row
  auto* out = static_cast<uint4*>(p.out) + (e * p.K + g0 * mxfp4::kBlockValues) * out_row +
              n0 / kChunk<kOut>;
  constexpr int kItems = (kRows / 8) * T::kWords / T::kThreads;
  const int lane = tx % 32;
  const int warp = tx / 32;
#pragma unroll 1
  for (int j = 0; j < kItems; ++j) {
    const int item = warp + j * (T::kThreads / 32);  // the warp's (octet group, word group)
    const int octet_group = item % (kRows / 8 / T::kLanesN);
    const int word_group = item / (kRows / 8 / T::kLanesN);
    const int o = octet_group * T::kLanesN + lane % T::kLanesN;
    const int w = word_group * T::kLanesK + lane / T::kLanesN;
    if (8 * o >= rows_here || w >= 4 * blocks_here) continue;
    uint32_t x[8];
    uint8_t s[8];
    bool finite = true;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = 8 * o + i;
      x[i] = tile[r * T::kWords + (w ^ T::Swizzle(r))];
      s[i] = tile_scales[r * kG + w / 4];
      finite &= s[i] != mxfp4::kScaleNan;
    }
    uint4* dst = out + static_cast<int64_t>(8 * w) * out_row + (8 * o) / kChunk<kOut>;
    const bool second_chunk = kOut != DType::kF32 || 8 * o + 4 < rows_here;  // fp32: n 4..7
    if (finite) {
      float scale[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) scale[i] = mxfp4::ScaleToFloat(s[i]);
#pragma unroll
      for (int b = 0; b < 4; ++b) {  // byte b of each word: inputs k = 8 w + 2 b, + 1
        float2 v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = ByteValues((x[i] >> (8 * b)) & 0xFFu, scale[i]);
        if constexpr (kOut == DType::kF32) {
          dst[(2 * b) * out_row] = make_uint4(__float_as_uint(v[0].x), __float_as_uint(v[1].x),
                                              __float_as_uint(v[2].x), __float_as_uint(v[3].x));
          dst[(2 * b + 1) * out_row] = make_uint4(__float_as_uint(v[0].y), __float_as_uint(v[1].y),
                                                  __float_as_uint(v[2].y), __float_as_uint(v[3].y));
          if (second_chunk) {
            dst[(2 * b) * out_row + 1] =
                make_uint4(__float_as_uint(v[4].x), __float_as_uint(v[5].x),
                           __float_as_uint(v[6].x), __float_as_uint(v[7].x));
            dst[(2 * b + 1) * out_row + 1] =
                make_uint4(__float_as_uint(v[4].y), __float_as_uint(v[5].y),
                           __float_as_uint(v[6].y), __float_as_uint(v[7].y));
          }
        } else {
          dst[(2 * b) * out_row] =
              make_uint4(PackPair<kOut>(v[0].x, v[1].x), PackPair<kOut>(v[2].x, v[3].x),
                         PackPair<kOut>(v[4].x, v[5].x), PackPair<kOut>(v[6].x, v[7].x));
          dst[(2 * b + 1) * out_row] =
              make_uint4(PackPair<kOut>(v[0].y, v[1].y), PackPair<kOut>(v[2].y, v[3].y),
                         PackPair<kOut>(v[4].y, v[5].y), PackPair<kOut>(v[6].y, v[7].y));
        }
      }
    } else {  // a scale 0xFF: NaNs (inf * 0) take the host conversion's bits (RoundOutBits)
#pragma unroll 1
      for (int k = 0; k < 8; ++k) {
        uint32_t bits[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const auto byte = static_cast<uint8_t>(x[i] >> (8 * (k / 2)));
          bits[i] = RoundOutBits<kOut>(mxfp4::Element(mxfp4::NibbleOf(byte, k), s[i]));
        }
        if constexpr (kOut == DType::kF32) {
          dst[k * out_row] = make_uint4(bits[0], bits[1], bits[2], bits[3]);
          if (second_chunk) dst[k * out_row + 1] = make_uint4(bits[4], bits[5], bits[6], bits[7]);
        } else {
          dst[k * out_row] = PackBits<kOut>(bits);
        }
      }
    }
  }
}

// The (E, K, N) tile shapes the autotuner sweeps, as LaunchConfig{block_size = 256,
// words_per_thread = kG, rows_per_thread = kRows / 32}: runs of 128 or 256 bytes of each block row
// read, 512 B to 2 KiB of each result row written per warp. Each is one kernel instance.
struct KnTileShape {
  int g;
  int rows;
};
constexpr KnTileShape kKnTiles[] = {{8, 256}, {16, 256}, {16, 128}, {8, 512}, {8, 128}};

LaunchConfig KnTileConfig(const KnTileShape& s) {
  return LaunchConfig{.block_size = 256, .words_per_thread = s.g, .rows_per_thread = s.rows / 32};
}

template <DType kOut, int kG, int kRows>
absl::Status LaunchKnTile(const Mxfp4Params& p, cudaStream_t stream) {
  using T = Mxfp4KnTile<kOut, kG, kRows>;
  const int64_t tiles = p.experts * ((p.groups + kG - 1) / kG) * ((p.N + kRows - 1) / kRows);
  if (tiles == 0) return absl::OkStatus();
  if (tiles > int64_t{0x7FFFFFFF}) return absl::InvalidArgumentError("too many mxfp4 tiles");
  const auto kernel = Mxfp4KnTileKernel<kOut, kG, kRows>;
  if constexpr (T::kSharedBytes > 48 * 1024) {  // beyond the static default: opt in (per device)
    DEQUANTD_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSharedBytes));
  }
  kernel<<<static_cast<unsigned>(tiles), T::kThreads, T::kSharedBytes, stream>>>(p);
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// The instance of `config`'s tile shape (CanImplement checked it is one of kKnTiles).
template <DType kOut>
absl::Status LaunchKnTileOf(const LaunchConfig& config, const Mxfp4Params& p, cudaStream_t stream) {
  const int g = config.words_per_thread;
  const int rows = config.rows_per_thread * 32;
  if (g == 8 && rows == 256) return LaunchKnTile<kOut, 8, 256>(p, stream);
  if (g == 16 && rows == 256) return LaunchKnTile<kOut, 16, 256>(p, stream);
  if (g == 16 && rows == 128) return LaunchKnTile<kOut, 16, 128>(p, stream);
  if (g == 8 && rows == 512) return LaunchKnTile<kOut, 8, 512>(p, stream);
  if (g == 8 && rows == 128) return LaunchKnTile<kOut, 8, 128>(p, stream);
  return absl::InvalidArgumentError(
      absl::StrCat("mxfp4 (E, K, N) tile not instantiated: ", config.ToString()));
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

constexpr KernelVariant kMxfp4Variants[] = {KernelVariant::kV1PerElement, KernelVariant::kV4Vec16};

// Whether (v, shape) runs the (E, K, N) tile kernel, whose tile shape is the launch configuration
// (when the pointers are 16-byte aligned; otherwise v1's loop, which takes none).
bool UsesKnTile(KernelVariant v, const QuantShape& shape, DType out) {
  return v == KernelVariant::kV4Vec16 && shape.orientation == Orientation::kKN &&
         shape.N % (out == DType::kF32 ? 4 : 8) == 0;
}

std::vector<LaunchConfig> KnTileConfigs() {
  std::vector<LaunchConfig> configs;
  for (const KnTileShape& t : kKnTiles) configs.push_back(KnTileConfig(t));
  return configs;
}

// The first tile shape: 128-byte runs of each block row read, 512 bytes (fp32: 1 KiB) of each
// result row written per warp, 33 KiB of shared memory.
LaunchConfig Mxfp4DefaultConfig(KernelVariant v, const QuantShape& shape, DType out) {
  return UsesKnTile(v, shape, out) ? KnTileConfigs().front() : LaunchConfig{};
}

std::vector<LaunchConfig> Mxfp4CandidateConfigs(KernelVariant v, const QuantShape& shape,
                                                DType out) {
  return UsesKnTile(v, shape, out) ? KnTileConfigs() : std::vector<LaunchConfig>{LaunchConfig{}};
}

bool Mxfp4IsTunable(KernelVariant v, const QuantShape& shape, DType out) {
  return UsesKnTile(v, shape, out) && shape.experts * shape.K * shape.N >= (int64_t{1} << 22);
}

absl::Status Mxfp4CanImplement(KernelVariant v, const LaunchConfig& config, const QuantShape& shape,
                               DType out) {
  if (UsesKnTile(v, shape, out)) {
    const std::vector<LaunchConfig> configs = KnTileConfigs();
    if (std::find(configs.begin(), configs.end(), config) != configs.end()) {
      return absl::OkStatus();
    }
    std::vector<std::string> names;
    for (const LaunchConfig& c : configs) names.push_back(c.ToString());
    return absl::InvalidArgumentError(absl::StrCat(
        "v4_vec16 of mxfp4 (E, K, N) takes a tile shape (block = threads, words = blocks of 32 "
        "inputs k, rows = rows n / 32), one of ",
        absl::StrJoin(names, " | "), ": got ", config.ToString()));
  }
  if (!(config == LaunchConfig{})) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(VariantName(v)),
                     " of mxfp4 takes no launch parameters here: config must be the default, got ",
                     config.ToString()));
  }
  return absl::OkStatus();
}

// Launches the dispatcher's output dtype instance of v1 or v4.
template <DType kOut>
absl::Status LaunchMxfp4(KernelVariant v, const LaunchConfig& config, const Mxfp4Params& p,
                         cudaStream_t stream) {
  const int64_t outputs = p.experts * p.K * p.N;
  const bool vec = Aligned16(p.blocks);
  switch (v) {
    case KernelVariant::kV1PerElement:
      return LaunchGridStride(Mxfp4PerElementKernel<kOut>, outputs, kBlockThreads, p, stream);
    case KernelVariant::kV4Vec16:
      if (vec && p.nk && ChunkAligned(p.out, p.K, kOut)) {
        return LaunchRowChunks<Mxfp4NkChunks, kOut>(p, p.experts * p.N, p.K, stream);
      }
      if (vec && !p.nk && ChunkAligned(p.out, p.N, kOut)) {
        return LaunchKnTileOf<kOut>(config, p, stream);
      }
      return LaunchGridStride(Mxfp4PerElementKernel<kOut>, outputs, kBlockThreads, p, stream);
    default:
      return absl::InvalidArgumentError("kernel variant not implemented for mxfp4");
  }
}

absl::Status Mxfp4Launch(KernelVariant v, const LaunchConfig& config, const QuantView& in,
                         DType out_dtype, void* out, cudaStream_t stream) {
  const QuantShape& shape = in.shape;
  if (mxfp4::Blocks(in) == nullptr || mxfp4::Scales(in) == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("blocks, scales and out must be non-null");
  }
  Mxfp4Params p;
  p.blocks = mxfp4::Blocks(in);
  p.scales = mxfp4::Scales(in);
  p.out = out;
  p.K = shape.K;
  p.N = shape.N;
  p.experts = shape.experts;
  p.groups = shape.K / mxfp4::kBlockValues;
  p.nk = shape.orientation == Orientation::kNK;
  switch (out_dtype) {
    case DType::kF16:
      return LaunchMxfp4<DType::kF16>(v, config, p, stream);
    case DType::kBF16:
      return LaunchMxfp4<DType::kBF16>(v, config, p, stream);
    case DType::kF32:
      return LaunchMxfp4<DType::kF32>(v, config, p, stream);
    default:
      return absl::InvalidArgumentError("unsupported output dtype");
  }
}

}  // namespace

const FormatKernels kMxfp4Kernels = {.variants = kMxfp4Variants,
                                     .default_config = &Mxfp4DefaultConfig,
                                     .candidate_configs = &Mxfp4CandidateConfigs,
                                     .is_tunable = &Mxfp4IsTunable,
                                     .can_implement = &Mxfp4CanImplement,
                                     .launch = &Mxfp4Launch};

}  // namespace dequantd::cuda
