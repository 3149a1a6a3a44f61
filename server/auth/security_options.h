// SecurityOptions: the --tls-*, --auth-*, --reflection and --health-listen settings of dequantd
// (no gRPC types here: server.h includes it). ServerSecurity (server_security.h) applies them.
#pragma once

#include <string>

namespace dequantd::auth {

struct SecurityOptions {
  std::string tls_cert;       // PEM chain; with tls_key serves gRPC over TLS; empty = plaintext
  std::string tls_key;        // PEM private key of tls_cert
  std::string tls_client_ca;  // PEM CA(s) that client certificates must chain to (mutual TLS)
  std::string auth_tokens;    // "ROLE TOKEN" file (token_set.h); empty = no tokens required
  bool allow_insecure_tokens = false;  // allow tokens over plaintext on a non-loopback listener
  bool reflection = true;              // serve grpc.reflection (with tokens: reader and admin)
  std::string health_listen;           // plaintext grpc.health.v1-only HOST:PORT; empty = none
  int refresh_seconds = 5;             // how often the TLS and token files are checked, 1..3600
};

}  // namespace dequantd::auth
