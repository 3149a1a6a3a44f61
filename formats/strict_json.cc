// Strict JSON reading (see strict_json.h).
#include "formats/strict_json.h"

#include <limits>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dequantd::formats {

using nlohmann::json;

absl::StatusOr<json> ParseJsonNoDuplicateKeys(absl::string_view text) {
  // nlohmann's parser callback sees object_start, key and object_end events in document order:
  // one set of keys per open object detects a repeat at its second occurrence.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const json::parser_callback_t callback = [&](int /*depth*/, json::parse_event_t event,
                                               json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  json root = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", duplicate, "' appears twice in one object"));
  }
  return root;
}

absl::StatusOr<int64_t> ExactInteger(const json& value, absl::string_view field, int64_t min,
                                     int64_t max) {
  auto range_error = [&](const std::string& shown) {
    return absl::InvalidArgumentError(
        absl::StrCat("field '", field, "' is ", shown, ", outside ", min, "..", max));
  };
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(max)) return range_error(std::to_string(u));
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v < min || v > max) return range_error(std::to_string(v));
    return v;
  }
  std::string got;
  if (value.is_string()) {
    got = absl::StrCat("the string ", value.dump());
  } else if (value.is_number_float()) {
    got = value.dump();  // e.g. 4.0, 1e+30
  } else {
    got = value.type_name();  // null, boolean, array, object
  }
  return absl::InvalidArgumentError(
      absl::StrCat("field '", field, "' must be an integer, got ", got));
}

}  // namespace dequantd::formats
