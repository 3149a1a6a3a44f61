// A checkpoint's config.json and its quantization_config, read as the checkpoint store reads them
// (server/model/checkpoint.cc) and as dequantctl's --packed input does (client/packed_input.cc):
// one reading of a checkpoint's declaration for both. JSON through formats/strict_json.h (a key
// twice in one object is refused); the format's row (kernels/format_registry.h) checks the
// quantization_config's fields. No network.
#pragma once

#include <filesystem>

#include "absl/status/statusor.h"
#include "kernels/format_registry.h"
#include "nlohmann/json.hpp"

namespace dequantd::formats {

// Reads and parses a JSON file that must hold an object. Errors: NOT_FOUND (no such regular
// file), PERMISSION_DENIED (cannot be read), INVALID_ARGUMENT (not JSON, a key twice in one
// object, not an object), each message starting with the path.
absl::StatusOr<nlohmann::json> ReadJsonObject(const std::filesystem::path& path);

// `config_path`'s quantization_config (a config.json, or any JSON file of the form
// {"quantization_config": {...}}), checked by the row of the format its quant_method names (any
// case). Errors: as ReadJsonObject's; INVALID_ARGUMENT "<path>: no 'quantization_config' object:
// not a quantized checkpoint", "<path>: quantization_config field 'quant_method' is 'x', only
// 'awq', ... are served", and the row's own ("<path>: quantization_config field '<field>' ...").
absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(
    const std::filesystem::path& config_path);

}  // namespace dequantd::formats
