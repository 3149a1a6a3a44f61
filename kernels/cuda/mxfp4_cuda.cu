// MXFP4's CUDA kernels (layer 2), their host launcher (layer 3) and its FormatKernels row entry
// (kernels/cuda/format_kernels.h). Two variants, either orientation, experts stacked:
//   v1_per_element: one thread per output element, in output order (coalesced stores);
//   v4_vec16:       16-byte aligned blocks and out, and whole 16-byte result chunks per row:
//                   (E, N, K) runs RowChunkKernel (row_chunk_kernel.cuh) over the E*N rows, one
//                   thread per 16-byte chunk (one 4- or 2-byte load of blocks, one scale, one
//                   16-byte store); (E, K, N) (N % chunk == 0) a shared-memory transpose: a
//                   128-thread block takes 128 rows n of one expert and two blocks (64 inputs k) of
//                   each, one thread per row n (two 16-byte loads: a whole 32-byte sector), decodes
//                   them into a 64 x 128 tile of rounded outputs and stores it in 16-byte chunks,
//                   consecutive threads along a result row. Other shapes run v1's loop.
// Both take no launch parameters (64-bit indices, grid-stride loops). Every path computes
// mxfp4::Element and rounds it once (mxfp4_decode.cuh). (A register-transpose (E, K, N) kernel
// with packed multiplies was measured slower, 2026-12-05: kernels/cuda/NOTES.md.)
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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
constexpr int kTileThreads = 128;  // (E, K, N) tile: rows n per tile, one thread each
constexpr int kTileBlocks = 2;     // blocks (of 32 inputs k) per tile row: one 32-byte sector
constexpr int kTileK = kTileBlocks * static_cast<int>(mxfp4::kBlockValues);

template <DType kOut>
using OutBits = std::conditional_t<kOut == DType::kF32, uint32_t, uint16_t>;

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

// (E, K, N): tile t covers rows n [n0, n0 + 128) of expert e and blocks [g0, g0 + 2) (inputs k
// [32 g0, 32 g0 + 64)).
template <DType kOut>
__global__ void Mxfp4KnTileKernel(Mxfp4Params p) {
  __shared__ __align__(16) OutBits<kOut> tile[kTileK][kTileThreads];
  const int64_t tiles_n = (p.N + kTileThreads - 1) / kTileThreads;
  const int64_t tiles_g = (p.groups + kTileBlocks - 1) / kTileBlocks;
  const int64_t tiles = p.experts * tiles_g * tiles_n;
  const int tx = static_cast<int>(threadIdx.x);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t e = t / (tiles_g * tiles_n);
    const int64_t g0 = t / tiles_n % tiles_g * kTileBlocks;
    const int64_t n0 = t % tiles_n * kTileThreads;
    const int64_t n = n0 + tx;
    const int blocks_here = static_cast<int>(std::min<int64_t>(kTileBlocks, p.groups - g0));
    if (n < p.N) {
      const int64_t b0 = (e * p.N + n) * p.groups + g0;  // first block of this row in the tile
      const auto* in = reinterpret_cast<const uint4*>(p.blocks) + b0;
      for (int h = 0; h < blocks_here; ++h) {
        const uint4 v = __ldg(in + h);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
        const uint8_t s = __ldg(p.scales + b0 + h);
        OutBits<kOut>* col = &tile[h * mxfp4::kBlockValues][tx];
        const float scale = mxfp4::ScaleToFloat(s);
#pragma unroll
        for (int j = 0; j < static_cast<int>(mxfp4::kBlockValues); j += 2) {
          uint32_t lo;
          uint32_t hi;
          if (s != mxfp4::kScaleNan) {
            const float2 ab = ByteValues((words[j / 8] >> (8 * ((j / 2) % 4))) & 0xFFu, scale);
            if constexpr (kOut == DType::kF32) {
              lo = __float_as_uint(ab.x);
              hi = __float_as_uint(ab.y);
            } else {
              const uint32_t pair = PackPair<kOut>(ab.x, ab.y);
              lo = pair & 0xFFFFu;
              hi = pair >> 16;
            }
          } else {  // NaNs (inf * 0) take the host conversion's bits (RoundOutBits)
            lo = RoundOutBits<kOut>(BlockValue(words, j, s));
            hi = RoundOutBits<kOut>(BlockValue(words, j + 1, s));
          }
          col[j * kTileThreads] = static_cast<OutBits<kOut>>(lo);
          col[(j + 1) * kTileThreads] = static_cast<OutBits<kOut>>(hi);
        }
      }
    }
    __syncthreads();
    // Each result row k of the tile is kTileThreads values of n: kRowChunks 16-byte chunks,
    // consecutive threads storing consecutive chunks (a warp writes whole rows).
    constexpr int kRowChunks = kTileThreads / kChunk<kOut>;
    const int rows = blocks_here * static_cast<int>(mxfp4::kBlockValues);
    const int64_t k0 = g0 * mxfp4::kBlockValues;
    const int64_t row_chunks = (p.N - n0) / kChunk<kOut>;  // N % kChunk == 0 (launcher)
    auto* out = static_cast<uint4*>(p.out);
    for (int i = tx; i < rows * kRowChunks; i += kTileThreads) {
      const int j = i / kRowChunks;
      const int c = i % kRowChunks;
      if (c < row_chunks) {
        out[((e * p.K + k0 + j) * p.N + n0) / kChunk<kOut> + c] =
            reinterpret_cast<const uint4*>(&tile[j][0])[c];
      }
    }
    __syncthreads();
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

constexpr KernelVariant kMxfp4Variants[] = {KernelVariant::kV1PerElement, KernelVariant::kV4Vec16};

LaunchConfig Mxfp4DefaultConfig(KernelVariant, const QuantShape&, DType) { return LaunchConfig{}; }

std::vector<LaunchConfig> Mxfp4CandidateConfigs(KernelVariant, const QuantShape&, DType) {
  return {LaunchConfig{}};
}

bool Mxfp4IsTunable(KernelVariant, const QuantShape&, DType) { return false; }

absl::Status Mxfp4CanImplement(KernelVariant v, const LaunchConfig& config, const QuantShape&,
                               DType) {
  if (!(config == LaunchConfig{})) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(VariantName(v)),
                     " of mxfp4 takes no launch parameters: config must be the default, got ",
                     config.ToString()));
  }
  return absl::OkStatus();
}

// Launches the dispatcher's output dtype instance of v1 or v4.
template <DType kOut>
absl::Status LaunchMxfp4(KernelVariant v, const Mxfp4Params& p, cudaStream_t stream) {
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
        const int64_t tiles = p.experts * ((p.groups + kTileBlocks - 1) / kTileBlocks) *
                              ((p.N + kTileThreads - 1) / kTileThreads);
        return LaunchGridStride(Mxfp4KnTileKernel<kOut>, tiles * kTileThreads, kTileThreads, p,
                                stream);
      }
      return LaunchGridStride(Mxfp4PerElementKernel<kOut>, outputs, kBlockThreads, p, stream);
    default:
      return absl::InvalidArgumentError("kernel variant not implemented for mxfp4");
  }
}

absl::Status Mxfp4Launch(KernelVariant v, const LaunchConfig&, const QuantView& in, DType out_dtype,
                         void* out, cudaStream_t stream) {
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
      return LaunchMxfp4<DType::kF16>(v, p, stream);
    case DType::kBF16:
      return LaunchMxfp4<DType::kBF16>(v, p, stream);
    case DType::kF32:
      return LaunchMxfp4<DType::kF32>(v, p, stream);
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
