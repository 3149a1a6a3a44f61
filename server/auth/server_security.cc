// ServerSecurity (see server_security.h).
#include "server/auth/server_security.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/security/server_credentials.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/auth/plaintext_credentials.h"

namespace dequantd::auth {
namespace {

constexpr int kMaxRefreshSeconds = 3600;

// Adds gRPC's reflection service to one server (on) or keeps it off even when another part of
// the process registered the global reflection plugin (off).
class ReflectionOption final : public grpc::ServerBuilderOption {
 public:
  explicit ReflectionOption(bool on) : on_(on) {}
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return p->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
    if (on_) plugins->push_back(std::make_unique<grpc::reflection::ProtoServerReflectionPlugin>());
  }

 private:
  const bool on_;
};

absl::Status CheckOptions(const SecurityOptions& options, const std::string& listen) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together: give both (PEM certificate chain and its private "
        "key) or neither");
  }
  if (!options.tls_client_ca.empty() && options.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key: client certificates are "
        "verified only over TLS");
  }
  if (options.refresh_seconds < 1 || options.refresh_seconds > kMaxRefreshSeconds) {
    return absl::InvalidArgumentError(absl::StrCat("--credentials-refresh-seconds must be in 1..",
                                                   kMaxRefreshSeconds, ", got ",
                                                   options.refresh_seconds));
  }
  if (!options.auth_tokens.empty() && options.tls_cert.empty() && !options.allow_insecure_tokens &&
      !IsLoopbackOrUnix(listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth-tokens over plaintext on --listen ", listen,
        " would send every token readable on the network: serve TLS (--tls-cert, --tls-key), "
        "listen on loopback or a Unix socket, or accept the risk with --allow-insecure-tokens"));
  }
  if (!options.health_listen.empty() && options.health_listen == listen &&
      !absl::EndsWith(listen, ":0")) {
    return absl::InvalidArgumentError(absl::StrCat("--health-listen and --listen are both ", listen,
                                                   ": give the health port its own port"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsLoopbackOrUnix(const std::string& address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    return true;
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<ServerSecurity>> ServerSecurity::Create(
    const SecurityOptions& options, const std::string& listen, SecurityObserver observer) {
  if (absl::Status s = CheckOptions(options, listen); !s.ok()) return s;
  std::unique_ptr<ServerSecurity> security(new ServerSecurity());
  security->options_ = options;
  security->observer_ = std::move(observer);
  const SecurityObserver& obs = security->observer_;

  if (!options.auth_tokens.empty()) {
    security->authorizer_ = std::make_shared<CallAuthorizer>(CallAuthorizer::Mode::kTokens, nullptr,
                                                             obs.on_call_denied);
    TokenFile::Observer token_observer;
    CallAuthorizer* authorizer = security->authorizer_.get();
    token_observer.on_loaded = [authorizer, &obs](std::shared_ptr<const TokenSet> set) {
      if (obs.on_tokens_loaded) obs.on_tokens_loaded(set->size());
      authorizer->SetTokens(std::move(set));
    };
    token_observer.on_reload_error = obs.on_tokens_reload_error;
    absl::StatusOr<std::unique_ptr<TokenFile>> tokens =
        TokenFile::Start(options.auth_tokens, options.refresh_seconds, std::move(token_observer));
    if (!tokens.ok()) return tokens.status();
    security->tokens_ = std::move(*tokens);
  }
  if (!options.tls_cert.empty()) {
    TlsReloader::Observer tls_observer{obs.on_tls_reload_error, obs.on_tls_served};
    absl::StatusOr<std::unique_ptr<TlsReloader>> tls =
        TlsReloader::Start(TlsFilePaths{options.tls_cert, options.tls_key, options.tls_client_ca},
                           options.refresh_seconds, std::move(tls_observer));
    if (!tls.ok()) return tls.status();
    security->tls_ = std::move(*tls);
  }
  return security;
}

ServerSecurity::~ServerSecurity() = default;

void ServerSecurity::AddTo(grpc::ServerBuilder& builder, const std::string& listen, int* port,
                           int* health_port) {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (tls_ != nullptr) {
    credentials = tls_->credentials();
    if (authorizer_ != nullptr) credentials->SetAuthMetadataProcessor(authorizer_);
  } else if (authorizer_ != nullptr) {
    credentials = PlaintextCredentialsWithProcessor(authorizer_);
  } else {
    credentials = grpc::InsecureServerCredentials();
  }
  builder.AddListeningPort(listen, credentials, port);
  if (!options_.health_listen.empty()) {
    builder.AddListeningPort(
        options_.health_listen,
        PlaintextCredentialsWithProcessor(std::make_shared<CallAuthorizer>(
            CallAuthorizer::Mode::kHealthOnly, nullptr, observer_.on_call_denied)),
        health_port);
  }
  builder.SetOption(std::make_unique<ReflectionOption>(options_.reflection));
}

}  // namespace dequantd::auth
