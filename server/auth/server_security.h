// ServerSecurity: everything dequantd's listeners need for TLS, tokens, per-RPC roles,
// reflection and the health-only port, built from SecurityOptions (the --tls-*, --auth-*,
// --reflection and --health-listen flags). README.md "Security" describes the behaviour;
// docs/security.md the design.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <grpcpp/server_builder.h>

#include "absl/status/statusor.h"
#include "server/auth/call_authorizer.h"
#include "server/auth/security_options.h"
#include "server/auth/tls_reloader.h"
#include "server/auth/token_file.h"

namespace dequantd::auth {

// Reports for metrics and logs. Every member may be empty; each must be thread-safe.
struct SecurityObserver {
  std::function<void(const TlsMaterial&)> on_tls_served;         // start and accepted reloads
  std::function<void(const absl::Status&)> on_tls_reload_error;  // refused reload, old kept
  std::function<void(size_t tokens)> on_tokens_loaded;           // start and accepted reloads
  std::function<void(const absl::Status&)> on_tokens_reload_error;
  std::function<void(grpc::StatusCode)> on_call_denied;  // UNAUTHENTICATED / PERMISSION_DENIED
};

// True when `address` is a Unix socket ("unix:..." / "unix-abstract:...") or HOST:PORT with
// HOST a loopback address (127.0.0.0/8, [::1]) or "localhost".
bool IsLoopbackOrUnix(const std::string& address);

class ServerSecurity {
 public:
  // Checks the options and loads the files. `listen` is the main gRPC address (where tokens
  // travel). Errors, INVALID_ARGUMENT naming the flag: --tls-cert without --tls-key or the
  // reverse, --tls-client-ca without --tls-cert, refresh_seconds out of 1..3600, --auth-tokens
  // over plaintext on a listener that is not loopback or a Unix socket without
  // --allow-insecure-tokens, --health-listen equal to --listen, and the files' own errors
  // (tls_files.h, token_file.h); INTERNAL when the TLS staging directory cannot be made.
  static absl::StatusOr<std::unique_ptr<ServerSecurity>> Create(const SecurityOptions& options,
                                                                const std::string& listen,
                                                                SecurityObserver observer);
  // Stops the file watchers. Destroy after the gRPC server.
  ~ServerSecurity();

  // Adds the main listener on `listen` (TLS when configured, with the token check when
  // configured), the health-only listener (when configured) and reflection (when on) to
  // `builder`. The bound ports are written to *port and *health_port when BuildAndStart runs.
  void AddTo(grpc::ServerBuilder& builder, const std::string& listen, int* port, int* health_port);

  bool tls() const { return tls_ != nullptr; }
  bool tokens() const { return tokens_ != nullptr; }

 private:
  ServerSecurity() = default;

  SecurityOptions options_;
  SecurityObserver observer_;
  std::shared_ptr<CallAuthorizer> authorizer_;  // null without --auth-tokens
  std::unique_ptr<TlsReloader> tls_;            // null without --tls-cert
  std::unique_ptr<TokenFile> tokens_;           // null without --auth-tokens
};

}  // namespace dequantd::auth
