// config.json and its quantization_config (see quant_config.h).
#include "formats/quant_config.h"

#include <climits>
#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "formats/strict_json.h"

namespace dequantd::formats {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool IsRegularFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// The value at `key` in `obj`: a member, or for a key holding '/' a path of object members
// ("config_groups/group_0/weights"); nullptr when absent or below a non-object, and for a path
// also when null (compressed-tensors writes null for every unset scheme field; a top-level null
// stays a value, which the typed getters refuse by name).
const json* FindKey(const json& obj, absl::string_view key) {
  const json* at = &obj;
  for (absl::string_view part : absl::StrSplit(key, '/')) {
    if (!at->is_object()) return nullptr;
    const auto it = at->find(std::string(part));
    if (it == at->end()) return nullptr;
    at = &*it;
  }
  return at->is_null() && absl::StrContains(key, '/') ? nullptr : at;
}

// The first of `keys` present in `obj` (FindKey), or nullptr; `*found` is set to its key.
const json* FindAny(const json& obj, std::initializer_list<const char*> keys,
                    const char** found = nullptr) {
  for (const char* k : keys) {
    if (const json* value = FindKey(obj, k); value != nullptr) {
      if (found != nullptr) *found = k;
      return value;
    }
  }
  return nullptr;
}

// The exact integer under the first of `keys` in `qc` (nullopt if none is present), or
// INVALID_ARGUMENT naming the key as written: "quantization_config field 'w_bit' must be an
// integer, got 4.0". Never narrowed: 4294967300 stays 4294967300.
absl::StatusOr<std::optional<int64_t>> ReadConfigInteger(const fs::path& config_path,
                                                         const json& qc,
                                                         std::initializer_list<const char*> keys) {
  const char* key = nullptr;
  const json* value = FindAny(qc, keys, &key);
  if (value == nullptr) return std::nullopt;
  absl::StatusOr<int64_t> exact = ExactInteger(*value, key, INT64_MIN, INT64_MAX);
  if (!exact.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path.string(), ": quantization_config ", exact.status().message()));
  }
  return *exact;
}

// QuantConfigReader over the quantization_config object of `config_path`.
class JsonQuantConfig final : public QuantConfigReader {
 public:
  JsonQuantConfig(const fs::path& path, const json& qc) : path_(path), qc_(qc) {}

  absl::StatusOr<std::vector<std::string>> Members(const char* key) const override {
    const json* value = FindKey(qc_, key);
    if (value == nullptr) return std::vector<std::string>{};
    if (!value->is_object()) return FieldError(key, "is not an object");
    std::vector<std::string> names;
    for (auto it = value->begin(); it != value->end(); ++it) names.push_back(it.key());
    return names;
  }
  absl::StatusOr<std::optional<int64_t>> Integer(
      std::initializer_list<const char*> keys) const override {
    return ReadConfigInteger(path_, qc_, keys);
  }
  absl::StatusOr<std::optional<bool>> Boolean(
      std::initializer_list<const char*> keys) const override {
    const char* key = nullptr;
    const json* value = FindAny(qc_, keys, &key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_boolean()) return FieldError(key, "is not a boolean");
    return value->get<bool>();
  }
  absl::StatusOr<std::optional<std::string>> String(
      std::initializer_list<const char*> keys) const override {
    const char* key = nullptr;
    const json* value = FindAny(qc_, keys, &key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_string()) return FieldError(key, "is not a string");
    return value->get<std::string>();
  }
  absl::StatusOr<std::optional<std::vector<int64_t>>> IntegerList(
      std::initializer_list<const char*> keys) const override {
    const char* key = nullptr;
    const json* value = FindAny(qc_, keys, &key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_array()) return FieldError(key, "is not a list of integers");
    std::vector<int64_t> out;
    for (const json& item : *value) {
      absl::StatusOr<int64_t> exact = ExactInteger(item, key, INT64_MIN, INT64_MAX);
      if (!exact.ok()) return FieldError(key, "is not a list of integers");
      out.push_back(*exact);
    }
    return out;
  }
  absl::Status FieldError(std::string_view field, std::string_view what) const override {
    return absl::InvalidArgumentError(absl::StrCat(path_.string(), ": quantization_config field '",
                                                   absl::string_view(field.data(), field.size()),
                                                   "' ",
                                                   absl::string_view(what.data(), what.size())));
  }

 private:
  const fs::path& path_;
  const json& qc_;
};

}  // namespace

absl::StatusOr<json> ReadJsonObject(const fs::path& path) {
  if (!IsRegularFile(path)) {
    std::error_code ec;
    if (fs::exists(path, ec)) {  // a directory, FIFO, ... (a dangling link does not exist)
      return absl::FailedPreconditionError(absl::StrCat(path.string(), ": not a regular file"));
    }
    return absl::NotFoundError(absl::StrCat(path.string(), ": not found"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat(path.string(), ": cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<json> parsed = ParseJsonNoDuplicateKeys(text.str());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", parsed.status().message()));
  }
  json j = *std::move(parsed);
  if (!j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not a JSON object"));
  return j;
}

absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(const fs::path& config_path) {
  absl::StatusOr<json> config = ReadJsonObject(config_path);
  if (!config.ok()) return config.status();
  const auto qc_it = config->find("quantization_config");
  if (qc_it == config->end() || !qc_it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_path.string(), ": no 'quantization_config' object: not a quantized checkpoint"));
  }
  const JsonQuantConfig reader(config_path, *qc_it);
  const json* method = FindAny(*qc_it, {"quant_method"});
  if (method == nullptr) return reader.FieldError("quant_method", "is missing");
  if (!method->is_string()) return reader.FieldError("quant_method", "is not a string");
  const std::string quant_method = method->get<std::string>();
  const FormatRow* row = FindFormatByQuantMethod(quant_method);
  if (row == nullptr) {
    return reader.FieldError("quant_method", absl::StrCat("is '", quant_method, "', only ",
                                                          ServedQuantMethods(), " are served"));
  }
  absl::StatusOr<QuantizationConfig> out = row->from_config(reader);
  if (out.ok()) out->quant_method = quant_method;
  return out;
}

}  // namespace dequantd::formats
