// Which dequantctl flags apply to which subcommand, so that a flag given to a subcommand that
// would ignore it is a usage error instead of being silently dropped. --server, --deadline and
// --lb and the TLS/token flags (--tls-ca, --tls-cert, --tls-key, --tls-server-name, --token-file)
// apply to every subcommand. Flag names are absl's spelling, with '_' ("out_dir"); messages
// spell them with '-' ("--out-dir"). Thread-safe (reads constant tables).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dequantd {

// OK when every flag in `specified` applies to `command`, or `command` is not a subcommand
// (list, info, dequantize, dequantize-layers, benchmark); flags that are not dequantctl's own
// (absl's --flagfile, ...) are not checked. Otherwise INVALID_ARGUMENT naming the first flag
// that does not apply and the subcommands it is for, e.g.
//   "--out-dir does not apply to 'dequantize' (it is for dequantize-layers)"
absl::Status CheckFlagsApply(absl::string_view command, const std::vector<std::string>& specified);

}  // namespace dequantd
