// Reading and checking the PEM files of --tls-cert, --tls-key and --tls-client-ca with OpenSSL,
// before gRPC is given them: at start-up (a bad file is a start-up error) and at every reload
// (a bad file keeps the certificate being served).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dequantd::auth {

struct TlsFilePaths {
  std::string cert;       // --tls-cert: PEM certificate chain, the server's own first
  std::string key;        // --tls-key: PEM private key of that certificate
  std::string client_ca;  // --tls-client-ca: PEM CA certificate(s); empty = no mutual TLS
};

// The checked contents of the files, and facts about the server certificate for logs/metrics.
struct TlsMaterial {
  std::string cert_pem;
  std::string key_pem;
  std::string client_ca_pem;   // empty when paths.client_ca is
  int64_t not_after_unix = 0;  // the server certificate's notAfter, seconds since the epoch
  std::string subject;         // e.g. "CN=dequantd"
  std::string serial_hex;      // e.g. "1A2B"
};

// Reads and checks the files: the chain holds at least one PEM certificate, the key is a PEM
// private key matching the first certificate, the CA file (if given) holds at least one PEM
// certificate. Errors: INVALID_ARGUMENT (unreadable file, no PEM certificate/key, key and
// certificate do not match); the message names the flag and the file, e.g.
//   "--tls-key /etc/dequantd/tls.key: no PEM private key".
absl::StatusOr<TlsMaterial> LoadTlsFiles(const TlsFilePaths& paths);

}  // namespace dequantd::auth
