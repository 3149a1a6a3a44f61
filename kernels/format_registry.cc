// The format registry's rows (see format_registry.h): one per Format, the only switch on format.
#include "kernels/format_registry.h"

#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/awq.h"
#include "kernels/awq_format.h"
#include "kernels/compressed_tensors.h"
#include "kernels/compressed_tensors_format.h"
#include "kernels/compressed_tensors_fp8.h"
#include "kernels/compressed_tensors_fp8_format.h"
#include "kernels/fp8_block.h"
#include "kernels/fp8_block_format.h"
#include "kernels/gptq.h"
#include "kernels/gptq_format.h"
#include "kernels/mxfp4.h"
#include "kernels/mxfp4_format.h"

#if DEQUANTD_HAVE_CUDA
#include "kernels/cuda/format_kernels.h"
#define DEQUANTD_FORMAT_KERNELS(name) (&cuda::name)
#else
#define DEQUANTD_FORMAT_KERNELS(name) nullptr
#endif

namespace dequantd {
namespace {

// In Format order: kRows[i].format == Format(i).
constexpr FormatRow kRows[] = {
    {.format = Format::kAwqGemm,
     .name = "awq_gemm",
     .quant_method = "awq",
     .role_count = awq::kRoleCount,
     .roles = {awq::kRoleNames[0], awq::kRoleNames[1], awq::kRoleNames[2]},
     .anchor_role = awq::kQweight,
     .optional_roles = 0,
     // AutoAWQ's ScaledActivation saves `<act>.scales` (Falcon `mlp.act.scales`, MPT
     // `ffn.act.scales`, BLOOM `gelu_impl.scales`): a plain tensor of that name.
     .plain_name_roles = 1u << awq::kScales,
     .default_orientation = Orientation::kKN,
     .from_config = &awq::FromConfig,
     .shape_from_stored = &awq::ShapeFromStored,
     .tensor_spec = &awq::TensorSpecOf,
     .validate = &awq::ValidateShape,
     .check_stored = nullptr,
     .reference = &awq::DequantizeReference,
     .cpu = &awq::DequantizeCpu,
     .cuda = DEQUANTD_FORMAT_KERNELS(kAwqKernels)},
    {.format = Format::kGptq,
     .name = "gptq",
     .quant_method = "gptq",
     .role_count = gptq::kRoleCount,
     .roles = {gptq::kRoleNames[0], gptq::kRoleNames[1], gptq::kRoleNames[2], gptq::kRoleNames[3]},
     .anchor_role = gptq::kQweight,
     .optional_roles = 1u << gptq::kGidx,
     .plain_name_roles = 1u << gptq::kScales,  // as AWQ's: a module's own `.scales` parameter
     .absent_role_flags = {0, 0, 0, gptq::kNoGidx},
     .default_orientation = Orientation::kNK,
     .from_config = &gptq::FromConfig,
     .shape_from_stored = &gptq::ShapeFromStored,
     .tensor_spec = &gptq::TensorSpecOf,
     .validate = &gptq::ValidateShape,
     .check_stored = &gptq::CheckStored,
     .reference = &gptq::DequantizeReference,
     .cpu = &gptq::DequantizeCpu,
     .cuda = DEQUANTD_FORMAT_KERNELS(kGptqKernels)},
    {.format = Format::kCompressedTensors,
     .name = "compressed_tensors",
     .quant_method = "compressed-tensors",
     .role_count = compressed_tensors::kRoleCount,
     .roles = {compressed_tensors::kRoleNames[0], compressed_tensors::kRoleNames[1],
               compressed_tensors::kRoleNames[2], compressed_tensors::kRoleNames[3],
               compressed_tensors::kRoleNames[4]},
     .anchor_role = compressed_tensors::kWeightPacked,
     .optional_roles =
         1u << compressed_tensors::kWeightZeroPoint | 1u << compressed_tensors::kWeightGidx,
     .absent_role_flags = {0, 0, compressed_tensors::kSym, compressed_tensors::kNoGidx, 0},
     .default_orientation = Orientation::kNK,
     .from_config = &compressed_tensors::FromConfig,
     .shape_from_stored = &compressed_tensors::ShapeFromStored,
     .tensor_spec = &compressed_tensors::TensorSpecOf,
     .validate = &compressed_tensors::ValidateShape,
     .check_stored = &compressed_tensors::CheckStored,
     .reference = &compressed_tensors::DequantizeReference,
     .cpu = &compressed_tensors::DequantizeCpu,
     .cuda = DEQUANTD_FORMAT_KERNELS(kCompressedTensorsKernels)},
    {.format = Format::kFp8Block,
     .name = "fp8_block",
     .quant_method = "fp8",
     .role_count = fp8_block::kRoleCount,
     .roles = {fp8_block::kRoleNames[0], fp8_block::kRoleNames[1]},
     .anchor_role = fp8_block::kWeightScaleInv,  // unquantized `.weight` tensors have none
     .optional_roles = 0,
     .plain_name_roles = 1u << fp8_block::kWeight,  // unquantized layers' `.weight`
     .default_orientation = Orientation::kNK,
     .from_config = &fp8_block::FromConfig,
     .shape_from_stored = &fp8_block::ShapeFromStored,
     .tensor_spec = &fp8_block::TensorSpecOf,
     .validate = &fp8_block::ValidateShape,
     .check_stored = nullptr,  // every byte is a value (E4M3 NaN passes through as NaN)
     .reference = &fp8_block::DequantizeReference,
     .cpu = &fp8_block::DequantizeCpu,
     .cuda = DEQUANTD_FORMAT_KERNELS(kFp8BlockKernels)},
    {.format = Format::kCompressedTensorsFp8,
     .name = "compressed_tensors_fp8",
     .quant_method = "compressed-tensors",  // found through kCompressedTensors' row (the first)
     .role_count = compressed_tensors_fp8::kRoleCount,
     .roles = {compressed_tensors_fp8::kRoleNames[0], compressed_tensors_fp8::kRoleNames[1]},
     .anchor_role = compressed_tensors_fp8::kWeightScale,  // unquantized `.weight`s have none
     .optional_roles = 0,
     .plain_name_roles = 1u << compressed_tensors_fp8::kWeight,  // unquantized layers' `.weight`
     .default_orientation = Orientation::kNK,
     // Shared with kCompressedTensors: `format: float-quantized` names this row.
     .from_config = &compressed_tensors::FromConfig,
     .shape_from_stored = &compressed_tensors_fp8::ShapeFromStored,
     .tensor_spec = &compressed_tensors_fp8::TensorSpecOf,
     .validate = &compressed_tensors_fp8::ValidateShape,
     .check_stored = nullptr,  // every byte is a value (E4M3 NaN passes through as NaN)
     .reference = &compressed_tensors_fp8::DequantizeReference,
     .cpu = &compressed_tensors_fp8::DequantizeCpu,
     .cuda = DEQUANTD_FORMAT_KERNELS(kCompressedTensorsFp8Kernels)},
    {.format = Format::kMxfp4,
     .name = "mxfp4",
     .quant_method = "mxfp4",
     .role_count = mxfp4::kRoleCount,
     .roles = {mxfp4::kRoleNames[0], mxfp4::kRoleNames[1]},
     .anchor_role = mxfp4::kBlocks,  // the bf16 tensors (attention, router, biases) have none
     .role_separator = "_",          // gpt-oss: <prefix>_blocks, <prefix>_scales
     .stacked_experts = true,        // [E, N, K/32, 16]: one layer per MoE projection
     .optional_roles = 0,
     .default_orientation = Orientation::kKN,  // transformers' [E, in, out]
     .from_config = &mxfp4::FromConfig,
     .shape_from_stored = &mxfp4::ShapeFromStored,
     .tensor_spec = &mxfp4::TensorSpecOf,
     .validate = &mxfp4::ValidateShape,
     .check_stored = nullptr,  // every byte is a value (scale 0xFF gives inf / NaN, as torch)
     .reference = &mxfp4::DequantizeReference,
     .cpu = &mxfp4::DequantizeCpu,
     .cuda = DEQUANTD_FORMAT_KERNELS(kMxfp4Kernels)},
};

constexpr bool RowsInFormatOrder() {
  for (size_t i = 0; i < std::size(kRows); ++i)
    if (static_cast<size_t>(kRows[i].format) != i) return false;
  return true;
}

static_assert(RowsInFormatOrder(), "kRows[i] must be the row of Format(i)");

// An optional role has the flag that says it is absent, a required one none.
constexpr bool AbsentFlagsOnOptionalRoles() {
  for (const FormatRow& row : kRows)
    for (size_t r = 0; r < static_cast<size_t>(kMaxTensorRoles); ++r)
      if (((row.optional_roles >> r & 1u) != 0) != (row.absent_role_flags[r] != 0)) return false;
  return true;
}

static_assert(AbsentFlagsOnOptionalRoles(),
              "absent_role_flags[r] must be set exactly for the optional roles");

}  // namespace

std::string FormatLabel(const QuantShape& shape) {
  std::string label(FormatName(shape.format));
  if (shape.orientation != FormatRowOf(shape.format).default_orientation)
    absl::StrAppend(&label, "/", std::string(OrientationName(shape.orientation)));
  if (shape.bits != 4) absl::StrAppend(&label, "/b", shape.bits);
  if (shape.format_flags != 0) absl::StrAppend(&label, "/f", shape.format_flags);
  if (shape.scale_block_rows > 1) absl::StrAppend(&label, "/r", shape.scale_block_rows);
  if (shape.experts != 1) absl::StrAppend(&label, "/e", shape.experts);
  return label;
}

const FormatRow& FormatRowOf(Format format) {
  const auto i = static_cast<size_t>(format);
  if (i >= std::size(kRows)) std::abort();  // every Format has a row (RowsInFormatOrder)
  return kRows[i];
}

absl::Span<const FormatRow> FormatRows() { return kRows; }

const FormatRow* FindFormatByQuantMethod(std::string_view quant_method) {
  for (const FormatRow& row : kRows) {
    if (absl::EqualsIgnoreCase(absl::string_view(quant_method.data(), quant_method.size()),
                               absl::string_view(row.quant_method.data(), row.quant_method.size())))
      return &row;
  }
  return nullptr;
}

std::string ServedQuantMethods() {
  std::string out;
  for (const FormatRow& row : kRows) {
    if (FindFormatByQuantMethod(row.quant_method) != &row) continue;  // named by an earlier row
    absl::StrAppend(&out, out.empty() ? "" : ", ", "'",
                    absl::string_view(row.quant_method.data(), row.quant_method.size()), "'");
  }
  return out;
}

}  // namespace dequantd
