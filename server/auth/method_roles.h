// Which RPC each role may call: the one table of dequantd's per-method access rules, keyed by
// the gRPC method path ("/package.Service/Method"). Methods not in the table are denied to
// every token (default deny): a new RPC must be added here to be callable with --auth-tokens.
#pragma once

#include <optional>
#include "absl/strings/string_view.h"

#include "server/auth/token_set.h"

namespace dequantd::auth {

// What calling a method needs.
enum class Access {
  kOpen,    // no token (grpc.health.v1: Kubernetes probes carry none)
  kReader,  // a reader or admin token
  kAdmin,   // an admin token
};

// The access `method_path` needs, or nullopt when the method is not in the table (deny).
// Thread-safe (a constant table).
std::optional<Access> RequiredAccess(absl::string_view method_path);

// Whether a token of `role` may call a method that needs `access`.
bool Allows(Role role, Access access);

// Whether `method_path` belongs to grpc.health.v1.Health (Check, Watch).
bool IsHealthMethod(absl::string_view method_path);

}  // namespace dequantd::auth
