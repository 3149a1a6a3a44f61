// GPTQ's CUDA kernels (layer 2), their host launcher (layer 3) and GPTQ's FormatKernels row
// entry (kernels/cuda/format_kernels.h). Two variants, any bits (2, 3, 4, 8), either orientation:
//   v1_per_element: one thread per output element, in output order (coalesced stores);
//   v2_per_word:    one thread per run of 32 consecutive rows k of one column n (the 32 codes of
//                   b words of qweight column n), its group's zero and scale reloaded only when
//                   the group changes; (K, N): consecutive threads take consecutive n (coalesced
//                   loads and stores); (N, K): consecutive threads take consecutive runs of one
//                   column (each stores 32 consecutive elements of output row n).
// Both take no launch parameters (256-thread blocks, grid-stride loops, 64-bit indices).
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/cuda/format_kernels.h"
#include "kernels/cuda/gptq_decode.cuh"
#include "kernels/cuda/launch_helpers.cuh"
#include "kernels/gptq_format.h"

namespace dequantd::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kRun = 32;  // rows of K per v2 thread

template <DType kScale, DType kOut>
__global__ void GptqPerElementKernel(GptqParams p) {
  const int64_t total = p.K * p.N;
  for (int64_t e = GlobalThreadIndex(); e < total; e += GridThreads()) {
    const int64_t k = p.nk ? e % p.K : e / p.N;
    const int64_t n = p.nk ? e / p.K : e % p.N;
    StoreElement<kOut>(p.out, e, GptqElement<kScale>(p, k, n, GptqGroup(p, k)));
  }
}

template <DType kScale, DType kOut>
__global__ void GptqPerRunKernel(GptqParams p) {
  const int64_t runs = (p.K + kRun - 1) / kRun;
  const int64_t total = runs * p.N;
  for (int64_t u = GlobalThreadIndex(); u < total; u += GridThreads()) {
    const int64_t n = p.nk ? u / runs : u % p.N;
    const int64_t k0 = (p.nk ? u % runs : u / p.N) * kRun;
    const int64_t k1 = k0 + kRun < p.K ? k0 + kRun : p.K;
    int64_t g = -1;
    float z = 0.0f;
    float s = 0.0f;
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t gk = GptqGroup(p, k);
      if (gk != g) {
        g = gk;
        z = static_cast<float>(gptq::ZeroAt(p.qzeros + g * p.zero_words, n, p.bits, p.flags));
        s = LoadScaleAsFloat<kScale>(p.scales, g * p.N + n);
      }
      // float(q) - float(z) is exact (small integers), so this equals float(q - z) * s.
      const float q = static_cast<float>(gptq::StreamField(p.qweight + n, p.N, k, p.bits));
      StoreElement<kOut>(p.out, p.nk ? n * p.K + k : k * p.N + n, (q - z) * s);
    }
  }
}

constexpr KernelVariant kGptqVariants[] = {KernelVariant::kV1PerElement, KernelVariant::kV2PerWord};

LaunchConfig GptqDefaultConfig(KernelVariant, const QuantShape&, DType) { return LaunchConfig{}; }

std::vector<LaunchConfig> GptqCandidateConfigs(KernelVariant, const QuantShape&, DType) {
  return {LaunchConfig{}};
}

bool GptqIsTunable(KernelVariant, const QuantShape&, DType) { return false; }

absl::Status GptqCanImplement(KernelVariant v, const LaunchConfig& config, const QuantShape&,
                              DType) {
  if (!(config == LaunchConfig{})) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(VariantName(v)),
                     " of gptq takes no launch parameters: config must be the default, got ",
                     config.ToString()));
  }
  return absl::OkStatus();
}

absl::Status GptqLaunch(KernelVariant v, const LaunchConfig&, const QuantView& in, DType out_dtype,
                        void* out, cudaStream_t stream) {
  const QuantShape& shape = in.shape;
  const bool has_gidx = (shape.format_flags & gptq::kNoGidx) == 0;
  if (gptq::Qweight(in) == nullptr || gptq::Qzeros(in) == nullptr || gptq::Scales(in) == nullptr ||
      (has_gidx && gptq::Gidx(in) == nullptr) || out == nullptr) {
    return absl::InvalidArgumentError(
        "qweight, qzeros, scales, g_idx (when stored) and out must "
        "be non-null");
  }
  GptqParams p;
  p.qweight = gptq::Qweight(in);
  p.qzeros = gptq::Qzeros(in);
  p.scales = gptq::Scales(in);
  p.g_idx = has_gidx ? gptq::Gidx(in) : nullptr;
  p.out = out;
  p.K = shape.K;
  p.N = shape.N;
  p.group_size = shape.group_size;
  p.groups = shape.groups();
  p.zero_words = gptq::StreamWords(shape.N, shape.bits);
  p.bits = shape.bits;
  p.flags = shape.format_flags;
  p.nk = shape.orientation == Orientation::kNK;
  return DispatchDTypes<DType::kF16, DType::kBF16>(
      shape.scale_dtype, out_dtype, [&](auto scale_c, auto out_c) {
        constexpr DType kScale = decltype(scale_c)::value;
        constexpr DType kOut = decltype(out_c)::value;
        switch (v) {
          case KernelVariant::kV1PerElement:
            return LaunchGridStride(GptqPerElementKernel<kScale, kOut>, p.K * p.N, kBlock, p,
                                    stream);
          case KernelVariant::kV2PerWord:
            return LaunchGridStride(GptqPerRunKernel<kScale, kOut>, (p.K + kRun - 1) / kRun * p.N,
                                    kBlock, p, stream);
          default:
            return absl::InvalidArgumentError("kernel variant not implemented for gptq");
        }
      });
}

}  // namespace

const FormatKernels kGptqKernels = {.variants = kGptqVariants,
                                    .default_config = &GptqDefaultConfig,
                                    .candidate_configs = &GptqCandidateConfigs,
                                    .is_tunable = &GptqIsTunable,
                                    .can_implement = &GptqCanImplement,
                                    .launch = &GptqLaunch};

}  // namespace dequantd::cuda
