// Host launcher of the CUDA AWQ dequantizer (layer 3): builds DequantParams, picks the kernel
// template instance for (variant, scale dtype, output dtype, words, rows) and launches it; and
// AWQ's FormatKernels row entry (kernels/cuda/format_kernels.h).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/cuda/dequant_kernels.cuh"
#include "kernels/cuda/format_kernels.h"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/cuda/layer_size.h"

namespace dequantd::cuda {
namespace {

// Calls f(std::integral_constant<int, value>) for value in {Options...}.
template <int kFirst, int... kRest, class F>
absl::Status DispatchInt(int value, const char* what, F&& f) {
  if (value == kFirst) return f(std::integral_constant<int, kFirst>{});
  if constexpr (sizeof...(kRest) > 0) {
    return DispatchInt<kRest...>(value, what, f);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unsupported ", what, " ", value));
  }
}

// v4 launches as a programmatic dependent launch (the kernel waits for the preceding grid before
// it touches memory, so stream order holds; the next launch's blocks get resident while this one
// drains) except on mid-size layers. Measured on the H200, graphs of back-to-back launches,
// fp16: +0.7 to +1.2 points of the peak copy rate on large layers, +7 on 1536x1536, -1.4 on
// 1536x8960.
bool UseProgrammaticLaunch(const QuantShape& shape) {
  return ClassifyLayer(shape) != LayerSize::kMid;
}

bool AlignedTo(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

static_assert(kAwqNkBlock == 256, "awq_launch_config.cc's (N, K) configurations name 256 threads");

constexpr KernelVariant kAwqVariants[] = {KernelVariant::kV1PerElement, KernelVariant::kV2PerWord,
                                          KernelVariant::kV3PerWordBlock, KernelVariant::kV4Vec16};

}  // namespace

const FormatKernels kAwqKernels = {.variants = kAwqVariants,
                                   .default_config = &AwqDefaultConfig,
                                   .candidate_configs = &AwqCandidateConfigs,
                                   .is_tunable = &AwqIsTunable,
                                   .can_implement = &AwqCanImplement,
                                   .launch = &AwqLaunch};

absl::Status AwqLaunch(KernelVariant v, const LaunchConfig& config, const QuantView& in,
                       DType out_dtype, void* out, cudaStream_t stream) {
  const void* scales = awq::Scales(in);
  if (awq::Qweight(in) == nullptr || awq::Qzeros(in) == nullptr || scales == nullptr ||
      out == nullptr)
    return absl::InvalidArgumentError("qweight, qzeros, scales and out must be non-null");
  const QuantShape& shape = in.shape;
  DequantParams p;
  p.qweight = reinterpret_cast<const uint32_t*>(awq::Qweight(in));
  p.qzeros = reinterpret_cast<const uint32_t*>(awq::Qzeros(in));
  p.scales = scales;
  p.out = out;
  p.K = shape.K;
  p.N = shape.N;
  p.words_per_row = shape.N / awq::kPackFactor;
  p.group_size = shape.group_size;
  p.nk = shape.orientation == Orientation::kNK;

  if (v == KernelVariant::kV4Vec16 && (!AlignedTo(scales, 16) || (!p.nk && !AlignedTo(out, 16))))
    return absl::InvalidArgumentError(
        "v4_vec16 needs 16-byte aligned scales and, for a (K, N) result, out pointers");

  return DispatchDTypes<DType::kF16, DType::kBF16>(
      shape.scale_dtype, out_dtype, [&](auto scale_c, auto out_c) {
        constexpr DType kScale = decltype(scale_c)::value;
        constexpr DType kOut = decltype(out_c)::value;
        switch (v) {
          case KernelVariant::kV1PerElement:
            return LaunchGridStride(DequantPerElementKernel<kScale, kOut>, shape.output_elements(),
                                    256, p, stream);
          case KernelVariant::kV2PerWord:
            return LaunchGridStride(DequantPerWordKernel<kScale, kOut>, shape.K * p.words_per_row,
                                    256, p, stream);
          case KernelVariant::kV3PerWordBlock:
            return LaunchGridStride(DequantPerWordKernel<kScale, kOut>, shape.K * p.words_per_row,
                                    config.block_size, p, stream);
          case KernelVariant::kV4Vec16:
            if (p.nk) {  // the tile transpose (CanImplement: rows_per_thread = tiles along K)
              DEQUANTD_CUDA_RETURN_IF_ERROR((LaunchAwqNkTiles<kScale, kOut>(
                  p, config.rows_per_thread, UseProgrammaticLaunch(shape), stream)));
              return absl::OkStatus();
            }
            return DispatchInt<1, 2, 4>(config.words_per_thread, "words_per_thread", [&](auto w_c) {
              return DispatchInt<1, 2, 4, 8, 16>(
                  config.rows_per_thread, "rows_per_thread", [&](auto r_c) -> absl::Status {
                    constexpr int kWords = decltype(w_c)::value;
                    constexpr int kRows = decltype(r_c)::value;
                    if constexpr (kWords * kRows > kV4MaxTileWords) {
                      return absl::InvalidArgumentError(
                          "v4 tile too large");  // CanImplement refuses
                    } else {
                      DEQUANTD_CUDA_RETURN_IF_ERROR((LaunchVec16<kScale, kOut, kWords, kRows>(
                          p, config.block_size, /*max_blocks=*/0, UseProgrammaticLaunch(shape),
                          stream)));
                      return absl::OkStatus();
                    }
                  });
            });
        }
        return absl::InvalidArgumentError("unknown kernel variant");
      });
}

}  // namespace dequantd::cuda
