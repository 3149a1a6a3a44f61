// compressed-tensors float-quantized FP8's CUDA kernels (layer 2), their host launcher (layer 3)
// and its FormatKernels row entry (kernels/cuda/format_kernels.h). Two variants, either
// orientation:
//   v1_per_element: one thread per output element, in output order (coalesced stores);
//   v4_vec16:       (N, K) with K and C multiples of 16 (so 16 consecutive elements of a row at a
//                   multiple of 16 share one scale, whether the block column is whole or the
//                   last, partial one) and a 16-byte aligned weight: one thread per 16 such
//                   elements (one 16-byte load of E4M3 bytes, one scale, 16 stores); other shapes
//                   and (K, N) run v1's loop.
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
#include "kernels/cuda/launch_helpers.cuh"

namespace dequantd::cuda {
namespace {

namespace ctf = compressed_tensors_fp8;

constexpr int kBlock = 256;
constexpr int kVec = 16;  // E4M3 bytes per v4 thread (one 16-byte load)

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

// (N, K), K % 16 == 0, C % 16 == 0, weight 16-byte aligned: vector v covers elements
// [16v, 16v + 16) of one row n, inside one scale block.
template <DType kScale, DType kOut>
__global__ void CtFp8NkVec16Kernel(CtFp8Params p) {
  const int64_t vectors = p.K * p.N / kVec;
  const auto* in = reinterpret_cast<const uint4*>(p.weight);
  for (int64_t v = GlobalThreadIndex(); v < vectors; v += GridThreads()) {
    const int64_t e = v * kVec;
    const float s = CtFp8Scale<kScale>(p, e / p.K, e % p.K);
    const uint4 bytes = __ldg(in + v);
    const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const auto b = static_cast<uint8_t>(words[j / 4] >> (8 * (j % 4)));
      StoreElement<kOut>(p.out, e + j, CtFp8Element<kScale>(b, s));
    }
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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
  const bool vec16 = p.nk && p.K % kVec == 0 && p.cols_per_scale % kVec == 0 && Aligned16(p.weight);
  return DispatchDTypes<DType::kF32, DType::kBF16, DType::kF16>(
      shape.scale_dtype, out_dtype, [&](auto scale_c, auto out_c) {
        constexpr DType kScale = decltype(scale_c)::value;
        constexpr DType kOut = decltype(out_c)::value;
        switch (v) {
          case KernelVariant::kV1PerElement:
            return LaunchGridStride(CtFp8PerElementKernel<kScale, kOut>, p.K * p.N, kBlock, p,
                                    stream);
          case KernelVariant::kV4Vec16:
            if (vec16) {
              return LaunchGridStride(CtFp8NkVec16Kernel<kScale, kOut>, p.K * p.N / kVec, kBlock, p,
                                      stream);
            }
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
