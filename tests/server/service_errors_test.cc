// Error answers of the running server seen by a gRPC client: DequantizeLayers without a model.
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "dequant/v1/dequant.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;
using ::testing::StartsWith;

// A server with no model (--model=) on the CPU backend, and a client of it.
class NoModelServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "";
    options.backend = "cpu";
    options.cpu_threads = 1;
    absl::StatusOr<std::unique_ptr<DequantServer>> server = DequantServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::DequantService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
  }

  // Reads the whole stream; returns the call's status and the number of messages in `messages`.
  template <typename Request, typename Call>
  grpc::Status ReadAll(const Request& request, Call call, int* messages) {
    grpc::ClientContext context;
    auto reader = ((*stub_).*call)(&context, request);
    v1::DequantizeResponse response;
    *messages = 0;
    while (reader->Read(&response)) ++*messages;
    return reader->Finish();
  }

  std::unique_ptr<DequantServer> server_;
  std::unique_ptr<v1::DequantService::Stub> stub_;
};

TEST_F(NoModelServerTest, DequantizeLayersIsFailedPreconditionWithOrWithoutNames) {
  int messages = -1;
  v1::DequantizeLayersRequest all;  // no names: every layer of the (absent) model
  grpc::Status status = ReadAll(all, &v1::DequantService::Stub::DequantizeLayers, &messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), StartsWith("no model is loaded"));
  EXPECT_EQ(messages, 0);

  v1::DequantizeLayersRequest named;
  named.add_tensors("model.layers.0.mlp.up_proj");
  status = ReadAll(named, &v1::DequantService::Stub::DequantizeLayers, &messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), StartsWith("no model is loaded"));
  EXPECT_EQ(messages, 0);
}

}  // namespace
}  // namespace dequantd
