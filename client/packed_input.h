// Builds an inline Dequantize input from a safetensors file holding PREFIX<role> for every role
// of a format (kernels/format_registry.h; AWQ GEMM, kernels/awq_format.h: PREFIXqweight int32
// (K, N/8), PREFIXqzeros int32 (K/G, N/8), PREFIXscales fp16|bf16 (K/G, N); MXFP4's PREFIX ends
// in its separator '_': PREFIXblocks, PREFIXscales). The tensors are checked against each other
// by formats::QuantShapeFromTensors with the checkpoint's quantization_config, the same check the
// server's checkpoint store makes (formats/quant_tensors.h; I32 or U32 accepted for packed int32
// words): for AWQ K = qweight rows, N = 8 * qweight columns, G = K / scales rows. The limits on the
// shape are left to the server, which names the field it rejects. AWQ goes in the message's
// qweight/qzeros/scales fields (read by every server version); other formats by role in
// `tensors`, with `experts`, `bits` and (GPTQ) `checkpoint_format` from the shape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "dequant/v1/dequant.pb.h"
#include "kernels/format_registry.h"
#include "kernels/quant_tensor.h"

namespace dequantd {

// What --packed is: its format and the quantization_config it was made with.
struct PackedDeclaration {
  Format format = Format::kAwqGemm;
  std::optional<QuantizationConfig> config;  // absent: no config found or given
  std::string config_path;                   // where `config` came from; empty without one
};

// The format named by `format_name` (--format: a FormatName such as "gptq"). INVALID_ARGUMENT
// naming the known ones when it is none of them.
absl::StatusOr<Format> ParseFormatFlag(const std::string& format_name);

// The declaration of `packed_path` as the server's checkpoint detection reads a checkpoint's
// (formats::ParseQuantizationConfig: quantization_config.quant_method and the format's own
// fields). `config_path` (--config) names the JSON file; empty = the first that exists of
// <packed without .safetensors>.config.json and config.json in the packed file's directory
// (none: no config). `format_name` (--format, a FormatName such as "gptq"): the format when no
// config is found; with a config it must agree with it. Neither: awq_gemm.
// Errors: INVALID_ARGUMENT (an unknown --format, naming the known ones; a --format that disagrees
// with the config, naming both; a config its format refuses, as the server's message), NOT_FOUND
// (an explicit --config that is not there).
absl::StatusOr<PackedDeclaration> FindPackedDeclaration(const std::string& packed_path,
                                                        const std::string& config_path,
                                                        const std::string& format_name);

// Errors: NOT_FOUND (file or tensor missing), DATA_LOSS (truncated file), INVALID_ARGUMENT
// (corrupt file, or a tensor with the wrong dtype or shape: the message names the file, tensor
// and field, e.g. "f.safetensors: tensor 'p.qzeros' (layer 'p'): field 'shape' is (72, 12), want
// (12, 72) = (K/G, N/8)"; a GPTQ layer without its config: its zero convention is not in the
// bytes), UNIMPLEMENTED for a layer that InlinePackedTensor cannot carry, naming the role whose
// size the request cannot say (compressed-tensors int strategy tensor: one scale). An optional
// role the layer does not store (GPTQ g_idx, compressed_tensors weight_zero_point and
// weight_g_idx) is left out of the request, which says the same; a compressed_tensors_fp8 scale
// grid of several rows per scale (strategies tensor and block) goes in scale_block_rows.
// `group_size`: 0 = G from the shapes (and config); any other value must equal it, else
// INVALID_ARGUMENT naming both (a contradicting value would reach the server as a byte count).
// `config`: the checkpoint's quantization_config (FindPackedDeclaration), null = none.
absl::StatusOr<::dequant::v1::InlinePackedTensor> LoadInlinePacked(
    const std::string& path, const std::string& prefix, int64_t group_size = 0,
    Format format = Format::kAwqGemm, const QuantizationConfig* config = nullptr);

}  // namespace dequantd
