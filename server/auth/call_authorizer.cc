// CallAuthorizer (see call_authorizer.h).
#include "server/auth/call_authorizer.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/auth/method_roles.h"

namespace dequantd::auth {
namespace {

constexpr absl::string_view kAuthorizationKey = "authorization";
constexpr absl::string_view kPathKey = ":path";

grpc::Status Unauthenticated(absl::string_view method_path, absl::string_view why) {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      absl::StrCat(method_path, ": ", why,
                                   " (send metadata \"authorization: Bearer TOKEN\" with a token "
                                   "from the server's --auth-tokens file)"));
}

}  // namespace

CallAuthorizer::CallAuthorizer(Mode mode, std::shared_ptr<const TokenSet> tokens,
                               DeniedObserver on_denied)
    : mode_(mode), on_denied_(std::move(on_denied)), tokens_(std::move(tokens)) {}

void CallAuthorizer::SetTokens(std::shared_ptr<const TokenSet> tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  tokens_ = std::move(tokens);
}

grpc::Status CallAuthorizer::Authorize(absl::string_view method_path,
                                       const absl::string_view* authorization) {
  grpc::Status status = Decide(method_path, authorization);
  if (!status.ok() && on_denied_) on_denied_(status.error_code());
  return status;
}

grpc::Status CallAuthorizer::Decide(absl::string_view method_path,
                                    const absl::string_view* authorization) {
  if (IsHealthMethod(method_path)) return grpc::Status::OK;
  if (mode_ == Mode::kHealthOnly) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(method_path,
                                     ": this listener (--health-listen) serves only "
                                     "grpc.health.v1.Health; call the main port (--listen)"));
  }
  if (authorization == nullptr) return Unauthenticated(method_path, "no authorization metadata");
  // RFC 6750: "Bearer" is case-insensitive, then one space, then the token.
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization->size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization->substr(0, kScheme.size()), kScheme)) {
    return Unauthenticated(method_path, "the authorization metadata is not \"Bearer TOKEN\"");
  }
  std::shared_ptr<const TokenSet> tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tokens = tokens_;
  }
  const std::optional<Role> role =
      tokens == nullptr ? std::nullopt : tokens->Find(authorization->substr(kScheme.size()));
  if (!role.has_value()) return Unauthenticated(method_path, "unknown token");
  const std::optional<Access> access = RequiredAccess(method_path);
  if (!access.has_value()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(method_path,
                                     ": this method is not in dequantd's access table "
                                     "(server/auth/method_roles.cc) and is denied to every role"));
  }
  if (!Allows(*role, *access)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(method_path, ": role ", RoleName(*role),
                                     " may not call this method (it needs admin)"));
  }
  return grpc::Status::OK;
}

grpc::Status CallAuthorizer::Process(const InputMetadata& auth_metadata,
                                     grpc::AuthContext* /*context*/,
                                     OutputMetadata* consumed_auth_metadata,
                                     OutputMetadata* /*response_metadata*/) {
  absl::string_view method_path;
  absl::string_view authorization;
  bool has_authorization = false;
  for (const auto& [key, value] : auth_metadata) {
    const absl::string_view k(key.data(), key.size());
    if (k == kPathKey) method_path = absl::string_view(value.data(), value.size());
    if (k == kAuthorizationKey) {
      // Two authorization values: refuse rather than guess which one counts.
      if (has_authorization)
        authorization = absl::string_view();
      else
        authorization = absl::string_view(value.data(), value.size());
      has_authorization = true;
    }
  }
  grpc::Status status = Authorize(method_path, has_authorization ? &authorization : nullptr);
  // The token stays out of the handlers' view of the metadata (nothing there can log it).
  if (status.ok() && has_authorization) {
    consumed_auth_metadata->emplace(std::string(kAuthorizationKey), std::string(authorization));
  }
  return status;
}

}  // namespace dequantd::auth
