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
    // The chunk's values, byte i's two from values(byte i).
    const auto chunk = [&](auto values) {
      float v[kValues];
#pragma unroll
      for (int i = 0; i < kValues / 2; ++i) {
        const float2 pair = values(ByteOf(bytes, i));
        v[2 * i] = pair.x;
        v[2 * i + 1] = pair.y;
      }
      return PackChunk<kOut>(v);
    };
    if (s <= kMaxScale14) {
      const float scale14 = Scale14(s);
      return chunk([&](uint32_t byte) { return ByteValues14(byte, scale14); });
    }
    if (s != mxfp4::kScaleNan) {
      const float scale = mxfp4::ScaleToFloat(s);
      return chunk([&](uint32_t byte) { return ByteValues(byte, scale); });
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

// (E, K, N): a shared-memory transpose, one tile per block, its shape a launch configuration
// (Mxfp4KnTile): the tile is kG blocks (32 inputs k each) of kRows rows n of one expert. Tiles are
// numbered n first, so the blocks resident together write whole result rows k and read runs of
// every block row.
//   Load: unit u = (word column c, block g), g fastest, so consecutive lanes read consecutive
//   16-byte blocks of a row (runs of 16 kG bytes). A unit is the rows of one 32-bit word of the
//   result (fp16 / bf16: rows n 2c and 2c + 1, the pair's low half the lower n; fp32: row c): it
//   decodes its blocks into the 32 words of result rows k = 32 g .. 32 g + 31, column c, each
//   value rounded once, one 32-bit shared store per word.
//   Store: result row k of the tile is kWords words (kRows n), read as 16-byte chunks, consecutive
//   threads along the row, and stored to global memory the same way.
// Word c of tile row k is kept at column c ^ (g(k) << kSwizzleShift) (g(k) = k / 32): the 32
// lanes of a load-phase store then hit 32 banks, and 16-byte chunks stay whole (the shift is >= 2).
template <DType kOut, int kG, int kRows>
struct Mxfp4KnTile {
  static constexpr int kValuesPerWord = kOut == DType::kF32 ? 1 : 2;
  static constexpr int kWords = kRows / kValuesPerWord;  // words per tile row k
  static constexpr int kUnits = kWords * kG;
  static constexpr int kThreads = kUnits < 256 ? kUnits : 256;
  static constexpr int kK = kG * static_cast<int>(mxfp4::kBlockValues);  // tile rows k
  static constexpr int kSwizzleShift = kG == 2 ? 4 : kG == 4 ? 3 : 2;    // log2(32 / kG)
  static constexpr int kSharedBytes = kK * kWords * 4;
  static_assert(kG == 2 || kG == 4 || kG == 8);
  static_assert(kWords % 32 == 0, "a tile row spans whole bank rows");
  static_assert(kUnits % kThreads == 0);
};

template <DType kOut, int kG, int kRows>
__global__ void __launch_bounds__(Mxfp4KnTile<kOut, kG, kRows>::kThreads)
    Mxfp4KnTileKernel(Mxfp4Params p) {
  using T = Mxfp4KnTile<kOut, kG, kRows>;
  extern __shared__ __align__(16) uint32_t tile[];  // [T::kK][T::kWords], swizzled
  const int64_t tiles_n = (p.N + kRows - 1) / kRows;
  const int64_t tiles_g = (p.groups + kG - 1) / kG;
  const int64_t t = blockIdx.x;
  const int64_t e = t / (tiles_g * tiles_n);
  const int64_t g0 = t / tiles_n % tiles_g * kG;
  const int64_t n0 = t % tiles_n * kRows;
  const int blocks_here = static_cast<int>(std::min<int64_t>(kG, p.groups - g0));
  const int tx = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int i = 0; i < T::kUnits / T::kThreads; ++i) {
    const int u = tx + i * T::kThreads;
    const int g = u % kG;
    const int c = u / kG;
    const int64_t n = n0 + static_cast<int64_t>(c) * T::kValuesPerWord;  // < N for both rows
    if (g >= blocks_here || n >= p.N) continue;
    uint4 v[T::kValuesPerWord];
    uint8_t s[T::kValuesPerWord];
#pragma unroll
    for (int r = 0; r < T::kValuesPerWord; ++r) {
      const int64_t b = (e * p.N + n + r) * p.groups + g0 + g;  // the block's index
      v[r] = __ldg(reinterpret_cast<const uint4*>(p.blocks) + b);
      s[r] = __ldg(p.scales + b);
    }
    uint32_t* col = tile + (32 * g) * T::kWords + (c ^ (g << T::kSwizzleShift));
    // Decodes the block's 16 bytes (inputs k = 2b, 2b + 1) of each row r with values(byte, r)
    // into the 32 words of its column.
    const auto decode = [&](auto values) {
#pragma unroll
      for (int b = 0; b < 16; ++b) {
        float2 x[T::kValuesPerWord];
#pragma unroll
        for (int r = 0; r < T::kValuesPerWord; ++r) {
          const uint32_t word = b < 4 ? v[r].x : b < 8 ? v[r].y : b < 12 ? v[r].z : v[r].w;
          x[r] = values(ByteOf(word, b % 4), r);
        }
        if constexpr (kOut == DType::kF32) {
          col[(2 * b) * T::kWords] = __float_as_uint(x[0].x);
          col[(2 * b + 1) * T::kWords] = __float_as_uint(x[0].y);
        } else {
          col[(2 * b) * T::kWords] = PackPair<kOut>(x[0].x, x[1].x);
          col[(2 * b + 1) * T::kWords] = PackPair<kOut>(x[0].y, x[1].y);
        }
      }
    };
    bool fast = true;  // every scale <= kMaxScale14: one multiply per value
    bool finite = true;
#pragma unroll
    for (int r = 0; r < T::kValuesPerWord; ++r) {
      fast &= s[r] <= kMaxScale14;
      finite &= s[r] != mxfp4::kScaleNan;
    }
    if (fast) {
      float scale14[T::kValuesPerWord];
#pragma unroll
      for (int r = 0; r < T::kValuesPerWord; ++r) scale14[r] = Scale14(s[r]);
      decode([&](uint32_t byte, int r) { return ByteValues14(byte, scale14[r]); });
    } else if (finite) {
      float scale[T::kValuesPerWord];
#pragma unroll
      for (int r = 0; r < T::kValuesPerWord; ++r) scale[r] = mxfp4::ScaleToFloat(s[r]);
      decode([&](uint32_t byte, int r) { return ByteValues(byte, scale[r]); });
    } else {  // a scale 0xFF: NaNs (inf * 0) take the host conversion's bits (RoundOutBits)
#pragma unroll 1
      for (int j = 0; j < static_cast<int>(mxfp4::kBlockValues); ++j) {
        uint32_t word = 0;
#pragma unroll
        for (int r = 0; r < T::kValuesPerWord; ++r) {
          const uint32_t w4[4] = {v[r].x, v[r].y, v[r].z, v[r].w};
          word |= RoundOutBits<kOut>(BlockValue(w4, j, s[r])) << (16 * r);
        }
        col[j * T::kWords] = word;
      }
    }
  }
  __syncthreads();
  // Thread tx stores chunk q = tx % kRowChunks of rows k = tx / kRowChunks + j * kRowsPerPass.
  constexpr int kRowChunks = T::kWords / 4;  // 16-byte chunks per tile row
  static_assert(T::kThreads % kRowChunks == 0);
  constexpr int kRowsPerPass = T::kThreads / kRowChunks;
  const int rows = blocks_here * static_cast<int>(mxfp4::kBlockValues);
  const int64_t row_chunks = (p.N - n0) / kChunk<kOut>;  // of this tile (N % kChunk == 0)
  const int64_t out_row_chunks = p.N / kChunk<kOut>;
  const int q = tx % kRowChunks;
  if (q >= row_chunks) return;
  int k = tx / kRowChunks;
  uint4* dst = static_cast<uint4*>(p.out) +
               ((e * p.K + g0 * mxfp4::kBlockValues + k) * p.N + n0) / kChunk<kOut> + q;
  const int64_t pass_stride = kRowsPerPass * out_row_chunks;
  for (; k < rows; k += kRowsPerPass, dst += pass_stride) {
    const int phys = (4 * q) ^ ((k / 32) << T::kSwizzleShift);
    *dst = *reinterpret_cast<const uint4*>(tile + k * T::kWords + phys);
  }
}

// The (E, K, N) tile shapes the autotuner sweeps, as LaunchConfig{block_size = threads,
// words_per_thread = kG, rows_per_thread = kRows / 32}. Each is one kernel instance. The first is
// the default (untuned shapes): the fastest of the five for 32x2880x5760 on an H100 (2026-12-05,
// NOTES.md), 8 blocks x 128 rows n for 16-bit results, 8 x 64 for fp32.
struct KnTileShape {
  int g;
  int rows;
};
constexpr KnTileShape kKnTiles16[] = {{8, 128}, {8, 64}, {4, 128}, {4, 64}, {2, 128}};
constexpr KnTileShape kKnTiles32[] = {{8, 64}, {8, 32}, {4, 64}, {4, 32}, {2, 64}};

int KnTileThreads(DType out, const KnTileShape& s) {
  const int units = s.rows / (out == DType::kF32 ? 1 : 2) * s.g;
  return std::min(units, 256);
}

LaunchConfig KnTileConfig(DType out, const KnTileShape& s) {
  return LaunchConfig{
      .block_size = KnTileThreads(out, s), .words_per_thread = s.g, .rows_per_thread = s.rows / 32};
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

// The instance of `config`'s tile shape (CanImplement checked it is one of the list's).
template <DType kOut>
absl::Status LaunchKnTileOf(const LaunchConfig& config, const Mxfp4Params& p, cudaStream_t stream) {
  const int g = config.words_per_thread;
  const int rows = config.rows_per_thread * 32;
  constexpr int kR = kOut == DType::kF32 ? 32 : 64;  // the smaller of the two row counts
  if (g == 8 && rows == kR) return LaunchKnTile<kOut, 8, kR>(p, stream);
  if (g == 4 && rows == 2 * kR) return LaunchKnTile<kOut, 4, 2 * kR>(p, stream);
  if (g == 4 && rows == kR) return LaunchKnTile<kOut, 4, kR>(p, stream);
  if (g == 8 && rows == 2 * kR) return LaunchKnTile<kOut, 8, 2 * kR>(p, stream);
  if (g == 2 && rows == 2 * kR) return LaunchKnTile<kOut, 2, 2 * kR>(p, stream);
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

std::vector<LaunchConfig> KnTileConfigs(DType out) {
  std::vector<LaunchConfig> configs;
  const absl::Span<const KnTileShape> tiles =
      out == DType::kF32 ? absl::MakeConstSpan(kKnTiles32) : absl::MakeConstSpan(kKnTiles16);
  for (const KnTileShape& t : tiles) configs.push_back(KnTileConfig(out, t));
  return configs;
}

// The first tile shape of each list (kG 8: 128-byte runs of every block row read, rows of 64
// fp16/bf16 or 32 fp32 values written).
LaunchConfig Mxfp4DefaultConfig(KernelVariant v, const QuantShape& shape, DType out) {
  return UsesKnTile(v, shape, out) ? KnTileConfigs(out).front() : LaunchConfig{};
}

std::vector<LaunchConfig> Mxfp4CandidateConfigs(KernelVariant v, const QuantShape& shape,
                                                DType out) {
  return UsesKnTile(v, shape, out) ? KnTileConfigs(out) : std::vector<LaunchConfig>{LaunchConfig{}};
}

bool Mxfp4IsTunable(KernelVariant v, const QuantShape& shape, DType out) {
  return UsesKnTile(v, shape, out) && shape.experts * shape.K * shape.N >= (int64_t{1} << 22);
}

absl::Status Mxfp4CanImplement(KernelVariant v, const LaunchConfig& config, const QuantShape& shape,
                               DType out) {
  if (UsesKnTile(v, shape, out)) {
    return ConfigAmong(KnTileConfigs(out), config,
                       "v4_vec16 of mxfp4 (E, K, N) takes a tile shape (block = threads, words = "
                       "blocks of 32 inputs k, rows = rows n / 32)");
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
