// PlaintextCredentialsWithProcessor (see plaintext_credentials.h).
#include "server/auth/plaintext_credentials.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>

#include <string>
#include <utility>
#include <vector>

namespace dequantd::auth {
namespace {

// The C processor callback: adapts gRPC core's metadata array to the C++ processor interface.
void ProcessMetadata(void* state, grpc_auth_context* /*context*/, const grpc_metadata* md,
                     size_t num_md, grpc_process_auth_metadata_done_cb cb, void* user_data) {
  auto& processor = *static_cast<std::shared_ptr<grpc::AuthMetadataProcessor>*>(state);
  grpc::AuthMetadataProcessor::InputMetadata input;
  for (size_t i = 0; i < num_md; ++i) {
    input.emplace(grpc::string_ref(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].key)),
                                   GRPC_SLICE_LENGTH(md[i].key)),
                  grpc::string_ref(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].value)),
                                   GRPC_SLICE_LENGTH(md[i].value)));
  }
  grpc::AuthMetadataProcessor::OutputMetadata consumed;
  grpc::AuthMetadataProcessor::OutputMetadata response;
  const grpc::Status status = processor->Process(input, nullptr, &consumed, &response);
  std::vector<grpc_metadata> consumed_md;
  for (const auto& [key, value] : consumed) {
    grpc_metadata m{};
    m.key = grpc_slice_from_copied_buffer(key.data(), key.size());
    m.value = grpc_slice_from_copied_buffer(value.data(), value.size());
    consumed_md.push_back(m);
  }
  cb(user_data, consumed_md.data(), consumed_md.size(), nullptr, 0,
     static_cast<grpc_status_code>(status.error_code()), status.error_message().c_str());
  for (grpc_metadata& m : consumed_md) {
    grpc_slice_unref(m.key);
    grpc_slice_unref(m.value);
  }
}

// gRPC core owns the processor from here: it calls this when its credentials (which the
// server's channels hold) are destroyed.
void DestroyProcessor(void* state) {
  delete static_cast<std::shared_ptr<grpc::AuthMetadataProcessor>*>(state);
}

class PlaintextCredentials final : public grpc::ServerCredentials {
 public:
  explicit PlaintextCredentials(std::shared_ptr<grpc::AuthMetadataProcessor> processor)
      : creds_(grpc_insecure_server_credentials_create()) {
    grpc_server_credentials_set_auth_metadata_processor(
        creds_, grpc_auth_metadata_processor{
                    ProcessMetadata, DestroyProcessor,
                    new std::shared_ptr<grpc::AuthMetadataProcessor>(std::move(processor))});
  }
  ~PlaintextCredentials() override { grpc_server_credentials_release(creds_); }

  // The processor is fixed at construction.
  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/) override {}

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }

  grpc_server_credentials* creds_;  // one reference; the server takes its own
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> PlaintextCredentialsWithProcessor(
    std::shared_ptr<grpc::AuthMetadataProcessor> processor) {
  return std::make_shared<PlaintextCredentials>(std::move(processor));
}

}  // namespace dequantd::auth
