// compressed-tensors float-quantized FP8's CUDA kernels (layer 2), their host launcher (layer 3)
// and its FormatKernels row entry (kernels/cuda/format_kernels.h). Two variants, either
// orientation:
//   v1_per_element: one thread per output element, in output order (coalesced stores);
//   v4_vec16:       (N, K) with K and C multiples of 8 (so a chunk of 8 consecutive elements of a
//                   row shares one scale, whether the block column is whole or the last, partial
//                   one), an 8-byte aligned weight and a 16-byte aligned out: RowChunkKernel
//                   (row_chunk_kernel.cuh), one thread per 16-byte chunk of a result row (one 8-
//                   or 4-byte load of E4M3 bytes, one scale, one 16-byte store); other shapes and
//                   (K, N) run v1's loop.
// Both take no launch parameters (256-thread blocks, grid-stride loops, 64-bit indices). Every
// path forms the same fp32 product, rounds it to the scale dtype and then to the output dtype
// with cvt.rn (compressed_tensors_fp8_format.h).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/compressed_tensors_fp8_format.h"
#include "kernels/cuda/compressed_tensors_fp8_decode.cuh"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/cuda/format_kernels.h"
#include "kernels/cuda/fp8_block_decode.cuh"  // E4m3x2ToFloat2
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/cuda/row_chunk_kernel.cuh"

namespace dequantd::cuda {
namespace {

namespace ctf = compressed_tensors_fp8;

constexpr int kBlock = 256;

template <DType kScale, DType kOut>
__global__ void CtFp8PerElementKernel(CtFp8Params p) {
  const int64_t total = p.K * p.N;
  for (int64_t e = GlobalThreadIndex(); e < total; e += GridThreads()) {
    const int64_t n = p.nk ? e / p.K : e % p.N;
    const int64_t k = p.nk ? e % p.K : e / p.N;
    const float s = CtFp8Scale<kScale>(p, n, k);
    StoreElement<kOut>(p.out, e, CtFp8Element<kScale>(__ldg(p.weight + n * p.K + k), s));
  }
}

// (N, K) chunks for RowChunkKernel: result row n, columns [k0, k0 + kChunk) from one 8-byte
// (fp16/bf16) or 4-byte (fp32) load of E4M3 bytes and one scale (C % 8 == 0: a chunk lies in one
// scale column block, whole or the last, partial one). Needs K % 8 == 0 and an 8-byte aligned
// weight. The scale index is ScaleIndex's, in 32-bit divisions (N, K < 2^31).
template <DType kScale>
struct CtFp8NkChunks {
  using Params = CtFp8Params;
  template <DType kOut>
  static __device__ __forceinline__ uint4 Chunk(const Params& p, int64_t n, int64_t k0) {
    constexpr int kValues = kChunk<kOut>;
    const int64_t scale_row = static_cast<uint32_t>(n) / static_cast<uint32_t>(p.rows_per_scale);
    const int64_t scale_col = static_cast<uint32_t>(k0) / static_cast<uint32_t>(p.cols_per_scale);
    const float s = LoadScaleAsFloat<kScale>(p.weight_scale, scale_row * p.grid_cols + scale_col);
    float v[kValues];
    E4m3Products(p.weight + n * p.K + k0, s, v);
    // round_sdt of each product; rounding twice to one dtype (round_sdt, then PackChunk's
    // round_out) is rounding once.
    if constexpr (kOut != kScale) {
#pragma unroll
      for (int j = 0; j < kValues; ++j) v[j] = RoundToScale<kScale>(v[j]);
    }
    return PackChunk<kOut>(v);
  }
};

bool Aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

constexpr KernelVariant kCtFp8Variants[] = {KernelVariant::kV1PerElement, KernelVariant::kV4Vec16};

LaunchConfig CtFp8DefaultConfig(KernelVariant, const QuantShape&, DType) { return LaunchConfig{}; }

std::vector<LaunchConfig> CtFp8CandidateConfigs(KernelVariant, const QuantShape&, DType) {
  return {LaunchConfig{}};
}

bool CtFp8IsTunable(KernelVariant, const QuantShape&, DType) { return false; }

absl::Status CtFp8CanImplement(KernelVariant v, const LaunchConfig& config, const QuantShape&,
                               DType) {
  if (!(config == LaunchConfig{})) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(VariantName(v)),
        " of compressed_tensors_fp8 takes no launch parameters: config must be the default, got ",
        config.ToString()));
  }
  return absl::OkStatus();
}

absl::Status CtFp8Launch(KernelVariant v, const LaunchConfig&, const QuantView& in, DType out_dtype,
                         void* out, cudaStream_t stream) {
  const QuantShape& shape = in.shape;
  if (ctf::Weight(in) == nullptr || ctf::WeightScale(in) == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("weight, weight_scale and out must be non-null");
  }
  CtFp8Params p;
  p.weight = ctf::Weight(in);
  p.weight_scale = ctf::WeightScale(in);
  p.out = out;
  p.K = shape.K;
  p.N = shape.N;
  p.rows_per_scale = ctf::RowsPerScale(shape);
  p.cols_per_scale = shape.group_size;
  p.grid_cols = ctf::GridDim(shape.K, shape.group_size);
  p.nk = shape.orientation == Orientation::kNK;
  const bool chunks = p.nk && p.K % 8 == 0 && p.cols_per_scale % 8 == 0 && Aligned8(p.weight) &&
                      ChunkAligned(out, p.K, out_dtype);
  return DispatchDTypes<DType::kF32, DType::kBF16, DType::kF16>(
      shape.scale_dtype, out_dtype, [&](auto scale_c, auto out_c) {
        constexpr DType kScale = decltype(scale_c)::value;
        constexpr DType kOut = decltype(out_c)::value;
        switch (v) {
          case KernelVariant::kV1PerElement:
            return LaunchGridStride(CtFp8PerElementKernel<kScale, kOut>, p.K * p.N, kBlock, p,
                                    stream);
          case KernelVariant::kV4Vec16:
            if (chunks) return LaunchRowChunks<CtFp8NkChunks<kScale>, kOut>(p, p.N, p.K, stream);
            return LaunchGridStride(CtFp8PerElementKernel<kScale, kOut>, p.K * p.N, kBlock, p,
                                    stream);
          default:
            return absl::InvalidArgumentError(
                "kernel variant not implemented for compressed_tensors_fp8");
        }
      });
}

}  // namespace

const FormatKernels kCompressedTensorsFp8Kernels = {.variants = kCtFp8Variants,
                                                    .default_config = &CtFp8DefaultConfig,
                                                    .candidate_configs = &CtFp8CandidateConfigs,
                                                    .is_tunable = &CtFp8IsTunable,
                                                    .can_implement = &CtFp8CanImplement,
                                                    .launch = &CtFp8Launch};

}  // namespace dequantd::cuda
