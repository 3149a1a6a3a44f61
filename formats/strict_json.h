// JSON parsing that refuses what nlohmann::json accepts silently: an object holding the same key
// twice (nlohmann keeps the last one), and integers read through a narrower type.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace dequantd::formats {

// Parses `text` as JSON. Errors (INVALID_ARGUMENT): not JSON ("not valid JSON"); an object with a
// repeated key ("key 'K' appears twice in one object"). Thread-safe (no shared state).
absl::StatusOr<nlohmann::json> ParseJsonNoDuplicateKeys(absl::string_view text);

// The exact integer value of `value`. INVALID_ARGUMENT naming `field` when it is not a JSON
// integer ("field 'bits' must be an integer, got 4.0" / "got the string \"4\"" / "got null") or
// lies outside [min, max] ("field 'bits' is 4294967300, outside -1..2147483647"). Never narrows.
absl::StatusOr<int64_t> ExactInteger(const nlohmann::json& value, absl::string_view field,
                                     int64_t min, int64_t max);

}  // namespace dequantd::formats
