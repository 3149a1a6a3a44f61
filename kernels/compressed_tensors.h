// The compressed-tensors format's row functions (kernels/format_registry.h): its
// quantization_config, the shape from its stored tensors, its tensor specs, shape and data checks,
// the reference (compressed_tensors_reference.cc) and the CPU path (compressed_tensors_cpu.cc).
// Called through the registry only; the layout is compressed_tensors_format.h. Arguments are
// validated by the generic entry points (kernels/dequant.h) first.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/format_registry.h"

namespace dequantd::compressed_tensors {

// quantization_config (compressed-tensors' QuantizationConfig.model_dump): format
// "pack-quantized" (any other, e.g. "float-quantized", "marlin-24", is refused naming what is
// served); quantization_status, when present, "compressed"; config_groups with at least one group
// whose `weights` scheme has num_bits 4 or 8, type "int", symmetric (missing: true), strategy
// "group" (group_size > 0), "channel" or "tensor" (symmetric only; missing strategy: group with a
// positive group_size, channel with -1, else tensor), actorder null, "static", "weight" or "group"
// (= weight_g_idx gathered), dynamic false; a group's own `format`, when set, equal to the top
// one. Several groups must declare the same weights scheme (one format and scheme per checkpoint;
// mixed schemes are refused). Groups without `weights` are skipped. Errors: INVALID_ARGUMENT
// naming the field by its path, e.g. "field 'config_groups/group_0/weights/num_bits' is 3, only 4
// and 8 are served".
absl::StatusOr<QuantizationConfig> FromConfig(const QuantConfigReader& config);

// weight_packed (N, K*b/32) I32; weight_scale F16, BF16 or F32: (N, K/G) group, (N, 1) channel,
// (1) or (1, 1) tensor; weight_zero_point (ceil(N*b/32), K/G) I32, optional unless declared
// asymmetric; weight_g_idx (K) I32, optional unless actorder "group"; weight_shape (2) I64.
// b from options.config (4 without one); N = weight_packed rows, K = 32 * its columns / b (the
// stored weight_shape values must agree: CheckStored); the strategy from the config, else from
// weight_scale's dims. Problems name the role and field ("shape is (64, 2), want (N, K/G) =
// (64, 4)", "presence": "is missing; symmetric is false, ...").
bool ShapeFromStored(absl::Span<const StoredTensor> tensors, const StoredTensorOptions& options,
                     QuantShape* shape, StoredTensorProblem* problem);

// Specs: weight_packed (N, K*b/32) I32; weight_scale (N, K/G), or (1, 1) with kTensorScale;
// weight_zero_point (ceil(N*b/32), K/G) I32 or (0, 0) with kSym; weight_g_idx (K, 1) I32 or (0, 0)
// with kNoGidx; weight_shape (2, 1) I64.
TensorSpec TensorSpecOf(const QuantShape& shape, int role);

// bits 4 or 8; format_flags within kKnownFlags (kTensorScale only with kSym and group_size K);
// N positive; K * bits a multiple of 32; group_size positive and dividing K; weight_scale fp16,
// bf16 or fp32.
absl::Status ValidateShape(const QuantShape& shape);

// The stored values' own rules (host pointers of a view that passed ValidateView): weight_shape
// is (N, K) (INVALID_ARGUMENT "weight_shape is (a, b), want (N, K) = (c, d)"); every weight_g_idx
// value in [0, K/G) (INVALID_ARGUMENT "weight_g_idx[k] is v, want [0, groups)") and every group
// holding exactly group_size columns (FAILED_PRECONDITION naming the group and its count).
absl::Status CheckStored(const QuantView& in);

absl::Status DequantizeReference(const QuantView& in, DType out_dtype, int64_t row_begin,
                                 int64_t row_end, void* out);
absl::Status DequantizeCpu(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                           void* out, const cpu::CpuDequantOptions& options);

}  // namespace dequantd::compressed_tensors
