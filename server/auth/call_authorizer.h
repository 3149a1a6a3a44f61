// CallAuthorizer: the gRPC AuthMetadataProcessor that admits or refuses each call before any
// handler runs, from its method path (":path") and its "authorization: Bearer TOKEN" metadata.
// gRPC runs it in the server's auth filter for every call on a listener whose credentials carry
// it (TLS or plaintext, see listener_credentials.h); a refusal ends the call with the returned
// status and the handler never sees it.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include "absl/strings/string_view.h"

#include <grpcpp/security/auth_metadata_processor.h>

#include "server/auth/token_set.h"

namespace dequantd::auth {

class CallAuthorizer final : public grpc::AuthMetadataProcessor {
 public:
  enum class Mode {
    kTokens,      // health open; every other method needs a token whose role allows it
    kHealthOnly,  // --health-listen: grpc.health.v1 only, no token; everything else refused
  };
  // Called once per refused call with the status code returned (UNAUTHENTICATED or
  // PERMISSION_DENIED); may be empty. Must be thread-safe.
  using DeniedObserver = std::function<void(grpc::StatusCode)>;

  CallAuthorizer(Mode mode, std::shared_ptr<const TokenSet> tokens, DeniedObserver on_denied);

  // Replaces the token set (a reload); calls already admitted are not affected. Thread-safe.
  void SetTokens(std::shared_ptr<const TokenSet> tokens);

  // The decision for a call of `method_path` whose "authorization" metadata is `authorization`
  // (nullptr: none sent). OK; UNAUTHENTICATED (no token, not "Bearer TOKEN", unknown token);
  // PERMISSION_DENIED (the role may not call the method, the method is not in the access table,
  // or a health-only listener). Messages name the method and the role, never the token.
  grpc::Status Authorize(absl::string_view method_path, const absl::string_view* authorization);

  // grpc::AuthMetadataProcessor: runs inline on gRPC's thread (it only hashes and compares).
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  grpc::Status Decide(absl::string_view method_path, const absl::string_view* authorization);

  const Mode mode_;
  const DeniedObserver on_denied_;
  std::mutex mu_;
  std::shared_ptr<const TokenSet> tokens_;  // guarded by mu_
};

}  // namespace dequantd::auth
