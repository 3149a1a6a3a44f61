// How dequantctl and the client library reach a dequantd that serves TLS, mutual TLS and/or
// requires a bearer token (README.md, Security): one function makes the channel.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dequantd {

struct ClientSecurityOptions {
  std::string tls_ca;           // PEM CA that verifies the server; set (or tls_cert) = TLS
  std::string tls_cert;         // PEM client certificate chain (mutual TLS), with tls_key
  std::string tls_key;          // PEM private key of tls_cert
  std::string tls_server_name;  // name to verify in the server certificate (and SNI);
                                // empty = the host of the target
  std::string token;            // sent as "authorization: Bearer TOKEN"; empty = none
  bool use_tls() const { return !tls_ca.empty() || !tls_cert.empty(); }
};

// A channel to `target` with `args`: TLS when security.use_tls() (verified against tls_ca, or
// the system's CA store when only a client certificate is given), plaintext otherwise, and the
// token on every call when one is given. Reads the PEM files now. Errors: INVALID_ARGUMENT
// naming the flag (and file): unreadable file, --tls-cert without --tls-key or the reverse,
// --tls-server-name without TLS.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateClientChannel(
    const std::string& target, const ClientSecurityOptions& security, grpc::ChannelArguments args);

// The token to send: the first line of `token_file` (surrounding whitespace removed) when it is
// given, else $DEQUANTD_TOKEN, else empty. Errors: INVALID_ARGUMENT naming --token-file and the
// file when it cannot be read or holds no token.
absl::StatusOr<std::string> ResolveToken(const std::string& token_file);

// `status` with a hint appended when it looks like a TLS mismatch, else `status` unchanged:
// UNAVAILABLE "Socket closed" from a plaintext client (a TLS server closes a connection that
// does not start with a handshake: "...; the server closed the connection: if it did so before
// any answer and it serves TLS, pass --tls-ca FILE"), or an SSL "wrong version number" from a TLS
// client (a plaintext server answered the handshake: "...; the server does not speak TLS: leave
// out --tls-ca and --tls-cert"). Used by dequantctl, whose flags the hints name.
absl::Status WithTlsMismatchHint(const absl::Status& status, bool client_uses_tls);

}  // namespace dequantd
