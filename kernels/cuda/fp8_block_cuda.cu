// FP8 block-scaled's CUDA kernels (layer 2), their host launcher (layer 3) and its FormatKernels
// row entry (kernels/cuda/format_kernels.h). Two variants, either orientation:
//   v1_per_element: one thread per output element, in output order (coalesced stores);
//   v4_vec16:       (N, K) with K % 8 == 0, an 8-byte aligned weight and a 16-byte aligned out:
//                   RowChunkKernel (row_chunk_kernel.cuh), one thread per 16-byte chunk of a result
//                   row (one 8- or 4-byte load of E4M3 bytes, one scale, one 16-byte store); other
//                   (N, K) shapes run v1's loop; (K, N): a 32x32
//                   shared-memory transpose tile per block (coalesced loads along k, stores
//                   along n), the fp32 products kept in the tile and rounded at the store.
// Both take no launch parameters (256-thread blocks, grid-stride loops, 64-bit indices). Every
// path forms the same fp32 product and rounds it once with cvt.rn (fp8_block_format.h).
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
#include "kernels/cuda/fp8_block_decode.cuh"
#include "kernels/cuda/row_chunk_kernel.cuh"
#include "kernels/fp8_block_format.h"

namespace dequantd::cuda {
namespace {

constexpr int kBlockThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 24;
constexpr int kTileDim = 32;  // (K, N) transpose tile: 32 n x 32 k
constexpr int kTileRows = 8;  // thread rows per tile block (32 x 8 = 256 threads)
static_assert(fp8_block::kBlock % 8 == 0 && fp8_block::kBlock % kTileDim == 0,
              "a v4 chunk and a transpose tile each lie inside one scale block");

__device__ __forceinline__ int64_t ThreadIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t Threads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

template <DType kScale, DType kOut>
__global__ void Fp8PerElementKernel(Fp8BlockParams p) {
  const int64_t total = p.K * p.N;
  for (int64_t e = ThreadIndex(); e < total; e += Threads()) {
    const int64_t n = p.nk ? e / p.K : e % p.N;
    const int64_t k = p.nk ? e % p.K : e / p.N;
    const float s = Fp8BlockScale<kScale>(p, n, k);
    StoreElement<kOut>(p.out, e, fp8_block::Fp32Product(__ldg(p.weight + n * p.K + k), s));
  }
}

// (N, K) chunks for RowChunkKernel: result row n, columns [k0, k0 + kChunk) from one 8-byte
// (fp16/bf16) or 4-byte (fp32) load of E4M3 bytes and the one scale of their block (128 is a
// multiple of the chunk). Needs K % 8 == 0 and an 8-byte aligned weight.
template <DType kScale>
struct Fp8BlockNkChunks {
  using Params = Fp8BlockParams;
  template <DType kOut>
  static __device__ __forceinline__ uint4 Chunk(const Params& p, int64_t n, int64_t k0) {
    constexpr int kValues = kChunk<kOut>;
    const float s = Fp8BlockScale<kScale>(p, n, k0);
    float v[kValues];
    E4m3Products(p.weight + n * p.K + k0, s, v);
    return PackChunk<kOut>(v);
  }
};

// (K, N): tile t covers weight rows [n0, n0 + 32) and columns [k0, k0 + 32) (one scale block).
template <DType kScale, DType kOut>
__global__ void Fp8KnTileKernel(Fp8BlockParams p) {
  __shared__ float tile[kTileDim][kTileDim + 1];  // +1: no bank conflicts on the transposed read
  const int64_t tiles_k = (p.K + kTileDim - 1) / kTileDim;
  const int64_t tiles = tiles_k * ((p.N + kTileDim - 1) / kTileDim);
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t n0 = t / tiles_k * kTileDim;
    const int64_t k0 = t % tiles_k * kTileDim;
    const float s = Fp8BlockScale<kScale>(p, n0, k0);
#pragma unroll
    for (int j = 0; j < kTileDim; j += kTileRows) {
      const int64_t n = n0 + ty + j;
      const int64_t k = k0 + tx;
      if (n < p.N && k < p.K) {
        tile[ty + j][tx] = fp8_block::Fp32Product(__ldg(p.weight + n * p.K + k), s);
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTileDim; j += kTileRows) {
      const int64_t k = k0 + ty + j;
      const int64_t n = n0 + tx;
      if (n < p.N && k < p.K) StoreElement<kOut>(p.out, k * p.N + n, tile[tx][ty + j]);
    }
    __syncthreads();
  }
}

template <DType T>
using DTypeConstant = std::integral_constant<DType, T>;

template <class F>
absl::Status DispatchDTypes(DType scale, DType out, F&& f) {
  const auto with_out = [&](auto s) -> absl::Status {
    switch (out) {
      case DType::kF16:
        return f(s, DTypeConstant<DType::kF16>{});
      case DType::kBF16:
        return f(s, DTypeConstant<DType::kBF16>{});
      case DType::kF32:
        return f(s, DTypeConstant<DType::kF32>{});
      default:
        return absl::InvalidArgumentError("unsupported output dtype");
    }
  };
  switch (scale) {
    case DType::kF32:
      return with_out(DTypeConstant<DType::kF32>{});
    case DType::kBF16:
      return with_out(DTypeConstant<DType::kBF16>{});
    case DType::kF16:
      return with_out(DTypeConstant<DType::kF16>{});
    default:
      return absl::InvalidArgumentError("unsupported weight_scale_inv dtype");
  }
}

template <class Kernel>
absl::Status Launch(Kernel kernel, int64_t work_items, dim3 block, const Fp8BlockParams& p,
                    cudaStream_t stream) {
  if (work_items == 0) return absl::OkStatus();
  const int64_t per_block = static_cast<int64_t>(block.x) * block.y;
  const int64_t blocks = std::min((work_items + per_block - 1) / per_block, kMaxBlocks);
  kernel<<<static_cast<unsigned>(blocks), block, 0, stream>>>(p);
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

bool Aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

constexpr KernelVariant kFp8BlockVariants[] = {KernelVariant::kV1PerElement,
                                               KernelVariant::kV4Vec16};

LaunchConfig Fp8BlockDefaultConfig(KernelVariant, const QuantShape&, DType) {
  return LaunchConfig{};
}

std::vector<LaunchConfig> Fp8BlockCandidateConfigs(KernelVariant, const QuantShape&, DType) {
  return {LaunchConfig{}};
}

bool Fp8BlockIsTunable(KernelVariant, const QuantShape&, DType) { return false; }

absl::Status Fp8BlockCanImplement(KernelVariant v, const LaunchConfig& config, const QuantShape&,
                                  DType) {
  if (!(config == LaunchConfig{})) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(VariantName(v)),
                     " of fp8_block takes no launch parameters: config must be the default, got ",
                     config.ToString()));
  }
  return absl::OkStatus();
}

absl::Status Fp8BlockLaunch(KernelVariant v, const LaunchConfig&, const QuantView& in,
                            DType out_dtype, void* out, cudaStream_t stream) {
  const QuantShape& shape = in.shape;
  if (fp8_block::Weight(in) == nullptr || fp8_block::ScaleInv(in) == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("weight, weight_scale_inv and out must be non-null");
  }
  Fp8BlockParams p;
  p.weight = fp8_block::Weight(in);
  p.scale_inv = fp8_block::ScaleInv(in);
  p.out = out;
  p.K = shape.K;
  p.N = shape.N;
  p.grid_cols = fp8_block::GridCols(shape.K);
  p.nk = shape.orientation == Orientation::kNK;
  const bool chunks =
      p.nk && p.K % 8 == 0 && Aligned8(p.weight) && ChunkAligned(out, p.K, out_dtype);
  return DispatchDTypes(shape.scale_dtype, out_dtype, [&](auto scale_c, auto out_c) {
    constexpr DType kScale = decltype(scale_c)::value;
    constexpr DType kOut = decltype(out_c)::value;
    const dim3 flat(kBlockThreads);
    switch (v) {
      case KernelVariant::kV1PerElement:
        return Launch(Fp8PerElementKernel<kScale, kOut>, p.K * p.N, flat, p, stream);
      case KernelVariant::kV4Vec16:
        if (chunks) return LaunchRowChunks<Fp8BlockNkChunks<kScale>, kOut>(p, p.N, p.K, stream);
        if (p.nk) return Launch(Fp8PerElementKernel<kScale, kOut>, p.K * p.N, flat, p, stream);
        return Launch(
            Fp8KnTileKernel<kScale, kOut>,
            (p.K + kTileDim - 1) / kTileDim * ((p.N + kTileDim - 1) / kTileDim) * kBlockThreads,
            dim3(kTileDim, kTileRows), p, stream);
      default:
        return absl::InvalidArgumentError("kernel variant not implemented for fp8_block");
    }
  });
}

}  // namespace

const FormatKernels kFp8BlockKernels = {.variants = kFp8BlockVariants,
                                        .default_config = &Fp8BlockDefaultConfig,
                                        .candidate_configs = &Fp8BlockCandidateConfigs,
                                        .is_tunable = &Fp8BlockIsTunable,
                                        .can_implement = &Fp8BlockCanImplement,
                                        .launch = &Fp8BlockLaunch};

}  // namespace dequantd::cuda
