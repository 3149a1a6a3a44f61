// DEQUANTD_INJECT_DEVICE_FAILURE parsing (see failure_injection.h).
#include "server/backend/failure_injection.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dequantd {

absl::StatusOr<std::map<std::string, DeviceFailureInjection>> ParseDeviceFailureInjection(
    absl::string_view spec) {
  std::map<std::string, DeviceFailureInjection> injections;
  if (absl::StripAsciiWhitespace(spec).empty()) return injections;
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    item = absl::StripAsciiWhitespace(item);
    const std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(item, '=');
    const absl::string_view label = parts.first;
    absl::string_view when = parts.second;
    DeviceFailureInjection injection;
    bool ok = absl::StartsWith(label, "cuda:") && label.size() > 5;
    if (when == "start") {
      injection.at_start = true;
    } else if (when == "launch") {
      injection.launches_before_failure = 0;
    } else if (absl::ConsumePrefix(&when, "launch@")) {
      ok = ok && absl::SimpleAtoi(when, &injection.launches_before_failure) &&
           injection.launches_before_failure >= 0;
    } else {
      ok = false;
    }
    if (!ok || !injections.emplace(std::string(label), injection).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(kInjectDeviceFailureEnv, ": \"", item,
                       "\" is not LABEL=start, LABEL=launch or LABEL=launch@N (LABEL e.g. cuda:1, "
                       "each at most once)"));
    }
  }
  return injections;
}

}  // namespace dequantd
