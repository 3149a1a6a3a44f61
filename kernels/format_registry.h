// The format registry: one row per Format, the only switch on format in the tree. A row holds
// everything the rest of dequantd needs of a format: its names, its stored tensors by role, how
// a checkpoint declares it (quantization_config), how its stored tensors give the layer's
// shape, its checks, its CPU reference and fast CPU path, and (with CUDA) its kernels. What a new
// format adds is in docs/architecture.md ("Formats as plug-ins"). Host only; no I/O: the
// checkpoint store reads config.json and safetensors headers and hands the row plain values.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/quant_tensor.h"

namespace dequantd {

namespace cuda {
struct FormatKernels;  // kernels/cuda/format_kernels.h
}

// A checkpoint's quantization_config object, read through the checkpoint store (over JSON).
// Each getter returns the value of the first of `keys` present (nullopt when none is), or
// INVALID_ARGUMENT naming the key when it has another JSON type ("... field 'w_bit' must be an
// integer, got 4.0"); integers are exact, never narrowed. A key holding '/' is a path of object
// members below quantization_config ("config_groups/group_0/weights/num_bits"), where a JSON null
// counts as absent (compressed-tensors writes null for unset fields); messages name the path as
// given.
class QuantConfigReader {
 public:
  // The member names of the object at `key` (a member or a path), in name order; empty when it
  // is absent or null; INVALID_ARGUMENT naming the key when it is not an object.
  virtual absl::StatusOr<std::vector<std::string>> Members(const char* key) const = 0;
  virtual ~QuantConfigReader() = default;
  virtual absl::StatusOr<std::optional<int64_t>> Integer(
      std::initializer_list<const char*> keys) const = 0;
  virtual absl::StatusOr<std::optional<bool>> Boolean(
      std::initializer_list<const char*> keys) const = 0;
  virtual absl::StatusOr<std::optional<std::string>> String(
      std::initializer_list<const char*> keys) const = 0;
  // A JSON array of exact integers (fp8's weight_block_size [128, 128]).
  virtual absl::StatusOr<std::optional<std::vector<int64_t>>> IntegerList(
      std::initializer_list<const char*> keys) const = 0;
  // INVALID_ARGUMENT "<config.json path>: quantization_config field '<field>' <what>".
  virtual absl::Status FieldError(std::string_view field, std::string_view what) const = 0;
};

// What a checkpoint's quantization_config declares, once its format's row has checked it.
struct QuantizationConfig {
  Format format = Format::kAwqGemm;
  std::string quant_method;  // as written, e.g. "awq"
  int bits = 4;
  int64_t group_size = 128;  // as written; -1 means per-column (G = K)
  bool zero_point = true;    // AWQ: zero_point; GPTQ: !sym (zeros are stored either way)
  bool desc_act = false;     // GPTQ: act-order (rows' groups come from g_idx, not k / G)
  std::string version;       // format-specific variant, e.g. AWQ's "gemm", GPTQ's "gptq_v2",
                             // compressed-tensors' "pack-quantized"
  // How scales are shared, where the format declares it (compressed-tensors: "group", "channel",
  // "tensor"); empty for AWQ and GPTQ (always per group).
  std::string strategy;
  // compressed-tensors float-quantized strategy "block": block_structure [rows, cols] (the scale
  // block is block_rows x group_size); 0 otherwise.
  int64_t block_rows = 0;
};

// A stored tensor as its checkpoint describes it: safetensors dtype code ("I32", "F16", ...) and
// dims. Passed to FormatRow::shape_from_stored in role order.
struct StoredTensor {
  std::string_view dtype;
  absl::Span<const int64_t> shape;
  bool present = true;  // false: an optional role the layer does not store (dtype, shape empty)
};

// Why stored tensors do not make a layer: the role at fault, the field ("shape" or "dtype") and
// what is wrong with it ("has 3 dims, want 2"); the caller names the file, tensor and layer.
struct StoredTensorProblem {
  int role = -1;
  std::string field;
  std::string what;
};

struct StoredTensorOptions {
  bool packed_u32 = false;  // also accept U32 for int32 packed words (dequantctl does)
  // The checkpoint's declaration, for formats whose stored tensors do not say everything (GPTQ:
  // bits, the zero convention, desc_act). Null: the format's defaults (GPTQ: 4 bits, gptq_v2
  // zeros, g_idx as stored).
  const QuantizationConfig* config = nullptr;
};

struct FormatRow {
  Format format;
  std::string_view name;          // FormatName: "awq_gemm"
  std::string_view quant_method;  // config.json quantization_config.quant_method, e.g. "awq"
  int role_count;                 // stored tensors per layer, <= kMaxTensorRoles
  std::array<std::string_view, kMaxTensorRoles> roles;  // role names = checkpoint suffixes
  int anchor_role;  // the role whose <layer><sep><role> tensor marks a layer in a checkpoint
  // What joins a layer's prefix and a role name in a checkpoint: "." (<layer>.qweight) for every
  // format but MXFP4, whose gpt-oss tensors are <prefix>_blocks / <prefix>_scales ("_").
  std::string_view role_separator = ".";
  // True when a layer may stack several matrices along a leading expert axis
  // (QuantShape::experts > 1; MXFP4's [E, ...] expert tensors). False: ValidateShape refuses
  // experts != 1.
  bool stacked_experts = false;
  // Bit r set: role r may be absent from a layer (GPTQ: g_idx without desc_act). An absent role
  // reaches shape_from_stored as StoredTensor::present == false; its TensorSpec then has 0 rows
  // and 0 columns, and its QuantView pointer is null.
  uint32_t optional_roles;
  // Bit r set: role r's checkpoint name is also what an unquantized tensor is called (the FP8
  // formats' `<prefix>.weight`; AWQ's and GPTQ's `.scales`, which AutoAWQ's ScaledActivation saves
  // for Falcon, MPT and BLOOM), so a tensor of that name without the anchor is a plain tensor.
  // Every other role marks its tensor as part of a layer: the checkpoint store refuses a tensor
  // named `<prefix><sep><role>` whose layer lacks the anchor (FAILED_PRECONDITION), the same rule
  // as for a layer that lacks any other required role.
  uint32_t plain_name_roles = 0;
  // For each optional role r: the QuantShape::format_flags bit that says a layer stores no r
  // (GPTQ g_idx: kNoGidx; compressed-tensors weight_zero_point: kSym, weight_g_idx: kNoGidx);
  // 0 for required roles. What an inline request that leaves r out means (server/rpc/request.cc);
  // shape_from_stored sets the same bits for a checkpoint's absent role.
  std::array<uint32_t, kMaxTensorRoles> absent_role_flags = {};
  // The result's layout when a request names none: the one the format's reference produces.
  Orientation default_orientation;

  // Checks the format's quantization_config (quant_method already matched) and returns it.
  absl::StatusOr<QuantizationConfig> (*from_config)(const QuantConfigReader& config);
  // The layer's shape from its stored tensors (role order), or false with `problem` filled.
  // Checks dtypes and how the dims agree; ValidateShape is the caller's next step.
  bool (*shape_from_stored)(absl::Span<const StoredTensor> tensors,
                            const StoredTensorOptions& options, QuantShape* shape,
                            StoredTensorProblem* problem);
  // Role `role`'s spec for a shape that passed ValidateShape.
  TensorSpec (*tensor_spec)(const QuantShape& shape, int role);
  // The format's own shape rules after ValidateShape's common ones (INVALID_ARGUMENT).
  absl::Status (*validate)(const QuantShape& shape);
  // Rules on the stored values themselves (host pointers of a view that passed ValidateView),
  // checked once where tensors enter: at checkpoint load and for inline requests. Null when the
  // format has none (AWQ). GPTQ: g_idx in range, symmetric zeros. The message names the role.
  absl::Status (*check_stored)(const QuantView& in);
  // DequantizeReference and DequantizeCpu of the format (arguments already validated). Rows are
  // rows of the result in in.shape.orientation: K rows for kKN, N rows for kNK.
  absl::Status (*reference)(const QuantView& in, DType out_dtype, int64_t row_begin,
                            int64_t row_end, void* out);
  absl::Status (*cpu)(const QuantView& in, DType out_dtype, int64_t row_begin, int64_t row_end,
                      void* out, const cpu::CpuDequantOptions& options);
  const cuda::FormatKernels* cuda;  // nullptr when built without CUDA
};

// The row of `format`. Every Format value has one; a value outside the enum (only a cast can
// make one: ValidateShape refuses it with INVALID_ARGUMENT before any row is used) is a
// programming error and aborts.
const FormatRow& FormatRowOf(Format format);
// Every row, in Format order.
absl::Span<const FormatRow> FormatRows();
// True when role `role` of `shape`'s format is optional and `shape` does not store it.
bool RoleAbsent(const QuantShape& shape, int role);
// The QuantShape::format_flags bits (FormatRow::absent_role_flags) that say a layer of `format`
// stores none of the roles in `absent_roles` (bit r: role r). Required roles add no bit. Used
// where a layer's shape is made from what a request or file left out (server/rpc/request.cc,
// client/packed_input.cc).
uint32_t AbsentRoleFlags(Format format, uint32_t absent_roles);

// The format and what of `shape` besides K, N, group_size and the scale dtype changes its kernels:
// FormatName, then "/nk" or "/kn" for an orientation other than the format's own, "/b<bits>" for
// bits other than 4, "/f<flags>" for format flags, "/r<rows>" for scale block rows above 1,
// "/e<E>" for experts other than 1; e.g. "awq_gemm", "awq_gemm/nk", "gptq/b8/f1", "mxfp4/e32".
// The autotuner's keys and the benchmark's rows name layouts so (every key of a format before
// mxfp4 reads as before: the tune file's version is unchanged).
std::string FormatLabel(const QuantShape& shape);

// The first row whose quant_method equals `quant_method` (case-insensitive), or nullptr. Rows that
// share a quant_method (compressed-tensors: pack-quantized and float-quantized) share its
// from_config, which names the row of the checkpoint in QuantizationConfig::format; the checkpoint
// store uses that row.
const FormatRow* FindFormatByQuantMethod(std::string_view quant_method);
// "'awq'" or "'awq', 'gptq'": the quant_methods served (each once), for messages.
std::string ServedQuantMethods();

}  // namespace dequantd
