// CreateClientChannel and ResolveToken (see credentials.h).
#include "client/credentials.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dequantd {
namespace {

absl::StatusOr<std::string> ReadFile(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": cannot read (", std::strerror(errno), ")"));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// Adds "authorization: Bearer TOKEN" to every call's initial metadata. An interceptor rather
// than call credentials: gRPC sends call credentials only over TLS, and a token may also go
// over plaintext to a loopback or Unix-socket server.
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;  // owned by the factory, which the channel keeps
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(const std::string& token)
      : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerTokenInterceptor(&header_);
  }

 private:
  const std::string header_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateClientChannel(
    const std::string& target, const ClientSecurityOptions& security, grpc::ChannelArguments args) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (security.tls_cert.empty() != security.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together (mutual TLS): give both or neither");
  }
  if (security.use_tls()) {
    grpc::SslCredentialsOptions ssl;
    if (!security.tls_ca.empty()) {
      absl::StatusOr<std::string> ca = ReadFile("--tls-ca", security.tls_ca);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = std::move(*ca);
    }
    if (!security.tls_cert.empty()) {
      absl::StatusOr<std::string> cert = ReadFile("--tls-cert", security.tls_cert);
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadFile("--tls-key", security.tls_key);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = std::move(*cert);
      ssl.pem_private_key = std::move(*key);
    }
    credentials = grpc::SslCredentials(ssl);
    if (!security.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(security.tls_server_name);
    }
  } else if (!security.tls_server_name.empty()) {
    return absl::InvalidArgumentError("--tls-server-name needs TLS: give --tls-ca");
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!security.token.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(security.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                                 std::move(interceptors));
}

namespace {

// A token goes out as an HTTP/2 header value: visible ASCII only (gRPC aborts the process on
// anything else). The error names the source and the byte, never the token.
absl::StatusOr<std::string> CheckedToken(std::string token, const std::string& source) {
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x21 || c > 0x7E) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the token holds byte 0x%02X at position %d; a token is visible ASCII "
          "(0x21-0x7E)",
          source, c, i));
    }
  }
  return token;
}

}  // namespace

absl::StatusOr<std::string> ResolveToken(const std::string& token_file) {
  if (token_file.empty()) {
    const char* env = std::getenv("DEQUANTD_TOKEN");
    return CheckedToken(std::string(env != nullptr ? absl::StripAsciiWhitespace(env) : ""),
                        "$DEQUANTD_TOKEN");
  }
  absl::StatusOr<std::string> contents = ReadFile("--token-file", token_file);
  if (!contents.ok()) return contents.status();
  const std::string first_line = contents->substr(0, contents->find('\n'));
  std::string token(absl::StripAsciiWhitespace(first_line));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token-file ", token_file, ": the first line holds no token"));
  }
  return CheckedToken(std::move(token), "--token-file " + token_file);
}

absl::Status WithTlsMismatchHint(const absl::Status& status, bool client_uses_tls) {
  if (status.code() != absl::StatusCode::kUnavailable) return status;
  absl::string_view hint;
  if (!client_uses_tls && absl::StrContains(status.message(), "Socket closed")) {
    // A TLS server closes a plaintext connection before any answer; a server that stops (or
    // restarts) mid-call closes it too, so the hint says which case it means.
    hint =
        "the server closed the connection: if it did so before any answer and it serves TLS, "
        "pass --tls-ca FILE";
  } else if (client_uses_tls && absl::StrContains(status.message(), "wrong version number")) {
    hint = "the server does not speak TLS: leave out --tls-ca and --tls-cert";
  } else {
    return status;
  }
  return absl::UnavailableError(absl::StrCat(status.message(), "; ", hint));
}

}  // namespace dequantd
