// MXFP4's row functions (kernels/format_registry.h): its quantization_config, the shape from its
// stored tensors, its tensor specs and shape checks, the reference (mxfp4_reference.cc) and the
// CPU path (mxfp4_cpu.cc). Called through the registry only; the layout is mxfp4_format.h.
// Arguments are validated by the generic entry points (kernels/dequant.h) first.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/format_registry.h"

namespace dequantd::mxfp4 {

// quantization_config {"quant_method": "mxfp4", "modules_to_not_convert": [...]}: nothing else is
// read (modules_to_not_convert names the bf16 modules, which the checkpoint stores as plain
// tensors; the store finds the quantized ones by their _blocks tensors). The result: bits 4,
// group_size 32, no zero point.
absl::StatusOr<QuantizationConfig> FromConfig(const QuantConfigReader& config);

// blocks (E, N, K/32, 16) U8 and scales (E, N, K/32) U8 (or, without an expert axis, (N, K/32, 16)
// and (N, K/32): E = 1). Problems name the role and field: "has 2 dims, want 4 (E, N, K/32, 16)
// or 3 (N, K/32, 16)", "is F8_E4M3, want U8", "is (2, 64, 2, 8), want a last dim of 16 bytes
// (32 E2M1 values)", "is (2, 64, 3), want (E, N, K/32) = (2, 64, 2) for blocks (2, 64, 2, 16)".
bool ShapeFromStored(absl::Span<const StoredTensor> tensors, const StoredTensorOptions& options,
                     QuantShape* shape, StoredTensorProblem* problem);

// blocks (E*N, K/2) U8; scales (E*N, K/32) U8: the stored tensors with their leading axes merged.
TensorSpec TensorSpecOf(const QuantShape& shape, int role);

// format_flags 0, bits 4, group_size 32, K a multiple of 32, N positive, scale dtype uint8
// (E8M0) (INVALID_ARGUMENT naming the field). experts is the generic ValidateShape's.
absl::Status ValidateShape(const QuantShape& shape);

absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out);
absl::Status DequantizeCpu(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                           void* out, const cpu::CpuDequantOptions& options);

}  // namespace dequantd::mxfp4
