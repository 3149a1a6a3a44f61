// The AWQ GEMM format's row functions (kernels/format_registry.h): its quantization_config, the
// shape from its stored tensors, its tensor specs and checks, the reference (awq_reference.cc)
// and the fast CPU path (awq_cpu.cc). Called through the registry only; the layout is
// awq_format.h. Arguments are validated by the generic entry points (kernels/dequant.h) first.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/format_registry.h"

namespace dequantd::awq {

// quantization_config (the transformers AwqConfig layout; AutoAWQ's quant_config.json names
// w_bit / q_group_size accepted): bits 4, zero_point true (missing = true), version "gemm" (any
// case; missing = "gemm"), group_size -1 or > 0 (missing = 128, the transformers default).
absl::StatusOr<QuantizationConfig> FromConfig(const QuantConfigReader& config);

// qweight (K, N/8) I32; qzeros (K/G, N/8) I32; scales (K/G, N) F16 or BF16. K = qweight rows,
// N = 8 * qweight columns, G = K / scales rows (must divide K). Problems, in this order:
//   shape has D dims, want 2; dtype is X, want I32 (qweight, then qzeros); dtype is X, want F16
//   or BF16 (scales); scales shape is (a, b), want N = 8 * qweight columns = N columns; scales
//   has R rows, which do not divide K = K into whole groups; qzeros shape is (a, b), want (c, d).
bool ShapeFromStored(absl::Span<const StoredTensor> tensors, const StoredTensorOptions& options,
                     QuantShape* shape, StoredTensorProblem* problem);

TensorSpec TensorSpecOf(const QuantShape& shape, int role);

// bits 4, format_flags 0, N a positive multiple of 8, group_size positive and dividing K, scales
// fp16 or bf16.
absl::Status ValidateShape(const QuantShape& shape);

absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out);
absl::Status DequantizeCpu(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                           void* out, const cpu::CpuDequantOptions& options);

}  // namespace dequantd::awq
