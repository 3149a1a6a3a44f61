// A format's CUDA kernels as its registry row holds them (FormatRow::cuda,
// kernels/format_registry.h): which kernel variants it implements, their launch configurations
// and checks, and its launcher. The generic entry points of dequant_cuda.h dispatch through this;
// nothing else calls these. Host types only.
#pragma once

#include <cuda_runtime_api.h>

#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cuda/dequant_cuda.h"

namespace dequantd::cuda {

struct FormatKernels {
  absl::Span<const KernelVariant> variants;  // implemented, fastest last
  // The entries behind DefaultConfig, CandidateConfigs and IsTunable (dequant_cuda.h), for a
  // variant in `variants` and a shape that passed ValidateShape.
  LaunchConfig (*default_config)(KernelVariant v, const QuantShape& shape, DType out_dtype);
  std::vector<LaunchConfig> (*candidate_configs)(KernelVariant v, const QuantShape& shape,
                                                 DType out_dtype);
  bool (*is_tunable)(KernelVariant v, const QuantShape& shape, DType out_dtype);
  // The variant's own limits on `config` after ValidateShape (INVALID_ARGUMENT naming the field).
  absl::Status (*can_implement)(KernelVariant v, const LaunchConfig& config,
                                const QuantShape& shape, DType out_dtype);
  // The launch after CanImplement (LaunchDequantize's contract: pointers, alignment, errors).
  absl::Status (*launch)(KernelVariant v, const LaunchConfig& config, const QuantView& in,
                         DType out_dtype, void* out, cudaStream_t stream);
};

// AWQ GEMM: v1-v4 (awq_launch_config.cc, dequant_cuda.cu).
extern const FormatKernels kAwqKernels;
// GPTQ: v1, v2, v4 (gptq_cuda.cu).
extern const FormatKernels kGptqKernels;
// compressed-tensors pack-quantized: v1, v2 (compressed_tensors_cuda.cu).
extern const FormatKernels kCompressedTensorsKernels;
// FP8 block-scaled: v1, v4 (fp8_block_cuda.cu).
extern const FormatKernels kFp8BlockKernels;
// compressed-tensors float-quantized FP8: v1, v4 (compressed_tensors_fp8_cuda.cu).
extern const FormatKernels kCompressedTensorsFp8Kernels;
// MXFP4 (gpt-oss): v1, v4 (mxfp4_cuda.cu).
extern const FormatKernels kMxfp4Kernels;

// For a variant whose launch configurations are a fixed list: OK when `config` is one of
// `configs`, otherwise INVALID_ARGUMENT "<what>, one of A | B | ...: got C" (what = the variant,
// format and the list's meaning). Host code (launch_config.cc).
absl::Status ConfigAmong(absl::Span<const LaunchConfig> configs, const LaunchConfig& config,
                         std::string_view what);

LaunchConfig AwqDefaultConfig(KernelVariant v, const QuantShape& shape, DType out_dtype);
std::vector<LaunchConfig> AwqCandidateConfigs(KernelVariant v, const QuantShape& shape,
                                              DType out_dtype);
bool AwqIsTunable(KernelVariant v, const QuantShape& shape, DType out_dtype);
absl::Status AwqCanImplement(KernelVariant v, const LaunchConfig& config, const QuantShape& shape,
                             DType out_dtype);
absl::Status AwqLaunch(KernelVariant v, const LaunchConfig& config, const QuantView& in,
                       DType out_dtype, void* out, cudaStream_t stream);

}  // namespace dequantd::cuda
