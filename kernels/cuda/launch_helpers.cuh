// What every format's CUDA launcher shares (no format knowledge here): the grid-stride thread
// indices of its kernels, the dispatch of a run-time (scale dtype, output dtype) pair to kernel
// template instances, the launch of a grid-stride kernel and of a programmatic dependent one.
// Included by dequant_cuda.cu (AWQ), gptq_cuda.cu and ct_cuda.cu; dequant_kernels.cuh uses the
// thread indices.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/dtype.h"

namespace dequantd::cuda {

// Grid-stride loops cover the rest; far below the 2^31 - 1 limit of gridDim.x.
inline constexpr int64_t kMaxGridBlocks = int64_t{1} << 24;

__device__ __forceinline__ int64_t GlobalThreadIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

template <DType T>
using DTypeConstant = std::integral_constant<DType, T>;

// Calls f(DTypeConstant<scale>) for `scale` one of kFirst, kRest...; INVALID_ARGUMENT otherwise.
template <DType kFirst, DType... kRest, class F>
absl::Status DispatchScaleDType(DType scale, F&& f) {
  if (scale == kFirst) return f(DTypeConstant<kFirst>{});
  if constexpr (sizeof...(kRest) > 0) {
    return DispatchScaleDType<kRest...>(scale, f);
  } else {
    return absl::InvalidArgumentError("unsupported scales dtype");
  }
}

// Calls f(DTypeConstant<scale>, DTypeConstant<out>) for the run-time pair, `scale` one of
// kScales... (the scale dtypes the format stores) and `out` fp16, bf16 or fp32; INVALID_ARGUMENT
// for any other (ValidateShape refused them before).
template <DType... kScales, class F>
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
  return DispatchScaleDType<kScales...>(scale, with_out);
}

// Launches kernel<<<grid, block, 0, stream>>>(args...), as a programmatic dependent launch when
// `pdl` (it may then start while the stream's previous grid drains: the kernel must execute
// griddepcontrol.wait before it touches memory). Returns the launch's error.
template <class... KernelArgs, class... Args>
cudaError_t LaunchProgrammatic(void (*kernel)(KernelArgs...), int64_t grid, int block, bool pdl,
                               cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(static_cast<unsigned>(block));
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Launches kernel<<<blocks, block_size, 0, stream>>>(params) with enough blocks for `work_items`
// grid-stride items (at most kMaxGridBlocks); nothing for 0 items. INTERNAL with the CUDA error
// when the launch fails.
template <class Kernel, class Params>
absl::Status LaunchGridStride(Kernel kernel, int64_t work_items, int block_size,
                              const Params& params, cudaStream_t stream) {
  if (work_items == 0) return absl::OkStatus();
  const int64_t blocks = std::min((work_items + block_size - 1) / block_size, kMaxGridBlocks);
  kernel<<<static_cast<unsigned>(blocks), block_size, 0, stream>>>(params);
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace dequantd::cuda
