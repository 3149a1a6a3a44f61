// The GPTQ format's row functions (kernels/format_registry.h): its quantization_config, the shape
// from its stored tensors, its tensor specs, shape and data checks, the reference
// (gptq_reference.cc) and the CPU path (gptq_cpu.cc). Called through the registry only; the layout
// is gptq_format.h. Arguments are validated by the generic entry points (kernels/dequant.h) first.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/format_registry.h"

namespace dequantd::gptq {

// quantization_config (GPTQModel's QuantizeConfig.to_dict, AutoGPTQ's quantize_config.json):
//   bits 2, 3, 4 or 8 (missing: 4); group_size -1 or > 0 (missing: 128); sym (missing: true);
//   desc_act (missing: false); checkpoint_format / format: "gptq" (v1 zeros; also when missing,
//   as GPTQModel's converter assumes) or "gptq_v2"; both keys present must agree; pack_dtype, when
//   present, "int32"; is_marlin_format true is refused. Unknown checkpoint_format values ("marlin",
//   "gptq_p", ...) and other bits are INVALID_ARGUMENT naming the field and what is served.
absl::StatusOr<QuantizationConfig> FromConfig(const QuantConfigReader& config);

// qweight (K*b/32, N) I32; qzeros (K/G, N*b/32) I32; scales (K/G, N) F16 or BF16; g_idx (K) I32,
// optional unless desc_act. b from options.config (4 without one); K = g_idx length when stored,
// else 32 * qweight rows / b; G from the config's group_size (-1: K), else K / scales rows.
// Problems name the role and field: dims, dtypes, "shape is (a, b), want (c, d) = (K/G, N)", g_idx
// "is missing; desc_act is true ..." (field "presence").
bool ShapeFromStored(absl::Span<const StoredTensor> tensors, const StoredTensorOptions& options,
                     QuantShape* shape, StoredTensorProblem* problem);

// g_idx's spec is (K, 1) I32, or (0, 0) when the layer stores none.
TensorSpec TensorSpecOf(const QuantShape& shape, int role);

// bits 2, 3, 4 or 8; format_flags within kKnownFlags; K * bits and N * bits multiples of 32;
// group_size positive and dividing K; scales fp16 or bf16.
absl::Status ValidateShape(const QuantShape& shape);

// The stored values' own rules (host pointers of a view that passed ValidateView): every g_idx
// value in [0, K/G) (INVALID_ARGUMENT "g_idx[k] is v, want [0, groups)"); for a layer declared sym
// every zero is 2^(b-1) (FAILED_PRECONDITION naming qzeros, the value found and, when it is the
// other checkpoint_format's symmetric zero, that convention).
absl::Status CheckStored(const QuantView& in);

absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out);
absl::Status DequantizeCpu(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                           void* out, const cpu::CpuDequantOptions& options);

}  // namespace dequantd::gptq
