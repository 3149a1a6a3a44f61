// The subcommands each dequantctl flag applies to (see flag_scope.h).
#include "client/flag_scope.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace dequantd {
namespace {

struct Subcommand {
  absl::string_view name;
  std::vector<absl::string_view> flags;  // besides the global ones
};

constexpr absl::string_view kGlobalFlags[] = {
    "server", "deadline", "lb", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "token_file"};

// Keep in step with the ABSL_FLAGs and the usage text of main.cc.
const std::vector<Subcommand>& Subcommands() {
  static const auto* const subcommands = new std::vector<Subcommand>{
      {"list", {}},
      {"info", {}},
      {"regions", {}},
      {"dequantize",
       {"tensor", "packed", "prefix", "format", "config", "group_size", "out", "dtype",
        "chunk_bytes", "compare", "streams", "compare_layout", "shm", "orientation"}},
      {"dequantize-layers",
       {"tensors", "dtype", "chunk_bytes", "out_dir", "out", "streams", "orientation"}},
      {"benchmark",
       {"shapes", "tensors", "group_size", "dtype", "variants", "trials", "runs",
        "hardware_counters"}},
  };
  return *subcommands;
}

bool Applies(const Subcommand& subcommand, absl::string_view flag) {
  return std::find(subcommand.flags.begin(), subcommand.flags.end(), flag) !=
         subcommand.flags.end();
}

std::string Spelled(absl::string_view flag) {
  return absl::StrCat("--", absl::StrReplaceAll(flag, {{"_", "-"}}));
}

// "a", "a and b", "a, b and c".
std::string EnglishList(const std::vector<absl::string_view>& items) {
  if (items.size() <= 1) return absl::StrJoin(items, "");
  return absl::StrCat(absl::StrJoin(items.begin(), items.end() - 1, ", "), " and ", items.back());
}

}  // namespace

absl::Status CheckFlagsApply(absl::string_view command, const std::vector<std::string>& specified) {
  const Subcommand* self = nullptr;
  for (const Subcommand& s : Subcommands()) {
    if (s.name == command) self = &s;
  }
  if (self == nullptr) return absl::OkStatus();
  for (const std::string& flag : specified) {
    if (std::find(std::begin(kGlobalFlags), std::end(kGlobalFlags), flag) !=
            std::end(kGlobalFlags) ||
        Applies(*self, flag)) {
      continue;
    }
    std::vector<absl::string_view> users;
    for (const Subcommand& s : Subcommands()) {
      if (Applies(s, flag)) users.push_back(s.name);
    }
    if (users.empty()) continue;  // not one of dequantctl's flags
    std::string message = absl::StrCat(Spelled(flag), " does not apply to '", command,
                                       "' (it is for ", EnglishList(users));
    // --tensor / --tensors: the singular and plural spellings belong to different subcommands.
    for (const std::string& other : {flag + "s", flag.substr(0, flag.size() - 1)}) {
      if (Applies(*self, other)) absl::StrAppend(&message, "; did you mean ", Spelled(other), "?");
    }
    return absl::InvalidArgumentError(absl::StrCat(message, ")"));
  }
  return absl::OkStatus();
}

}  // namespace dequantd
