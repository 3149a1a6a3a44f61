// Plaintext (no TLS) server credentials that still run an AuthMetadataProcessor.
//
// grpc::InsecureServerCredentials() aborts in SetAuthMetadataProcessor (gRPC 1.51:
// insecure_server_credentials.cc asserts), but gRPC core's own insecure credentials
// (grpc_insecure_server_credentials_create) run the server auth filter with a processor set
// through the C API, and that filter sees the method path. This wraps them.
#pragma once

#include <memory>

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/server_credentials.h>

namespace dequantd::auth {

// Plaintext credentials whose every call goes through `processor` first. The processor must not
// block (IsBlocking() false: it runs inline on gRPC's thread) and gets a null AuthContext (a
// plaintext peer has no authenticated properties). Thread-safe like any ServerCredentials.
std::shared_ptr<grpc::ServerCredentials> PlaintextCredentialsWithProcessor(
    std::shared_ptr<grpc::AuthMetadataProcessor> processor);

}  // namespace dequantd::auth
