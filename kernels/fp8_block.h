// The FP8 block-scaled format's row functions (kernels/format_registry.h): its
// quantization_config, the shape from its stored tensors, its tensor specs and shape checks, the
// reference (fp8_block_reference.cc) and the CPU path (fp8_block_cpu.cc). Called through the
// registry only; the layout is fp8_block_format.h. Arguments are validated by the generic entry
// points (kernels/dequant.h) first.
#pragma once

#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/format_registry.h"

namespace dequantd::fp8_block {

// quantization_config (DeepSeek-V3 config.json; Qwen3-FP8 likewise): weight_block_size [128, 128]
// (required: without it the checkpoint is not block-scaled), fmt "e4m3" (missing: e4m3), scale_fmt
// "ue8m0" or missing; activation_scheme is about activations and ignored. Anything else is
// INVALID_ARGUMENT naming the field and what is served, e.g. "field 'weight_block_size' is
// [64, 64], only [128, 128] is served". The result: bits 8, group_size 128 (the block),
// version = scale_fmt ("" when missing).
absl::StatusOr<QuantizationConfig> FromConfig(const QuantConfigReader& config);

// weight (N, K) F8_E4M3; weight_scale_inv (ceil(N/128), ceil(K/128)) F32, BF16 or F16. Problems
// name the role and field: "has 3 dims, want 2", "is F8_E5M2, want F8_E4M3", "is I32, want F32,
// BF16 or F16", "is (1, 2), want (ceil(N/128), ceil(K/128)) = (2, 2) for weight (N, K) = (136,
// 144): the scale grid must cover the weight in 128x128 blocks".
bool ShapeFromStored(absl::Span<const StoredTensor> tensors, const StoredTensorOptions& options,
                     QuantShape* shape, StoredTensorProblem* problem);

TensorSpec TensorSpecOf(const QuantShape& shape, int role);

// format_flags within kKnownFlags (bits is not read), group_size 128 (the block), N positive,
// scales fp32, bf16 or fp16 (INVALID_ARGUMENT naming the field).
absl::Status ValidateShape(const QuantShape& shape);

// Fp8E4m3BitsToFloat of every byte, built once (the CPU paths' widening table; also
// compressed_tensors_fp8_cpu.cc's).
const std::array<float, 256>& E4m3Table();

absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out);
absl::Status DequantizeCpu(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                           void* out, const cpu::CpuDequantOptions& options);

}  // namespace dequantd::fp8_block
