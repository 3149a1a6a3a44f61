// compressed-tensors float-quantized FP8's row functions (kernels/format_registry.h): the shape
// from its stored tensors, its tensor specs and shape checks, the reference
// (compressed_tensors_fp8_reference.cc) and the CPU path (compressed_tensors_fp8_cpu.cc). Its
// quantization_config is read by compressed_tensors::FromConfig (both rows share quant_method
// "compressed-tensors"; `format: float-quantized` names this row). Called through the registry
// only; the layout is compressed_tensors_fp8_format.h. Arguments are validated by the generic
// entry points (kernels/dequant.h) first.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/format_registry.h"

namespace dequantd::compressed_tensors_fp8 {

// weight (N, K) F8_E4M3; weight_scale F32, BF16 or F16 of the strategy's shape: tensor (1), () or
// (1, 1); channel (N, 1); group (N, K/G); block (ceil(N/R), ceil(K/C)) with [R, C] the declared
// block_structure. The strategy is options.config's; without a config it is read off
// weight_scale's dims (one element: tensor; (N, 1): channel; (N, g) with g dividing K: group of
// K/g; anything else is refused: a block grid does not say its block size). Problems name the role
// and field: "is F8_E5M2, want F8_E4M3", "is (64, 2), want (N, 1) = (64, 1) (strategy 'channel',
// weight (N, K) = (64, 128))".
bool ShapeFromStored(absl::Span<const StoredTensor> tensors, const StoredTensorOptions& options,
                     QuantShape* shape, StoredTensorProblem* problem);

// weight (N, K) F8_E4M3; weight_scale (ceil(N/R), ceil(K/C)) in the scale dtype.
TensorSpec TensorSpecOf(const QuantShape& shape, int role);

// format_flags 0 (bits is not read: an E4M3 element is 8 bits), N positive, group_size (C) and
// scale_block_rows (R; 0 reads as 1) in [1, kMaxOutputElements], scales fp32, bf16 or fp16
// (INVALID_ARGUMENT naming the field).
absl::Status ValidateShape(const QuantShape& shape);

absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out);
absl::Status DequantizeCpu(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                           void* out, const cpu::CpuDequantOptions& options);

}  // namespace dequantd::compressed_tensors_fp8
