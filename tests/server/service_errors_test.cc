// Error answers of the running server seen by a gRPC client: DequantizeLayers without a model,
// and names too long to quote in full (server/rpc/quoted_name.h).
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "dequant/v1/dequant.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rpc/quoted_name.h"
#include "server/server.h"
#include "tests/server/cpu_test_server.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(QuotedNameTest, ShortNamesAreQuotedWhole) {
  EXPECT_EQ(QuotedName(""), "\"\"");
  EXPECT_EQ(QuotedName("model.layers.0.mlp.up_proj"), "\"model.layers.0.mlp.up_proj\"");
  const std::string limit(200, 'a');
  EXPECT_EQ(QuotedName(limit), "\"" + limit + "\"");
}

TEST(QuotedNameTest, LongNamesKeepTheFirst200BytesAndGiveTheSize) {
  EXPECT_EQ(QuotedName(std::string(201, 'b')), "\"" + std::string(200, 'b') + "...\" (201 bytes)");
  EXPECT_EQ(QuotedName(std::string(20000, 'c')),
            "\"" + std::string(200, 'c') + "...\" (20000 bytes)");
}

TEST(QuotedNameTest, CutDoesNotSplitAUtf8Character) {
  // 199 ASCII bytes, then U+00E9 (0xC3 0xA9) at bytes 199..200: a cut at 200 would split it.
  const std::string name = std::string(199, 'x') + "\xC3\xA9" + std::string(50, 'y');
  EXPECT_EQ(QuotedName(name), "\"" + std::string(199, 'x') + "...\" (251 bytes)");
  // Not UTF-8 (continuation bytes only): cut at most 3 bytes short of the limit.
  EXPECT_EQ(QuotedName(std::string(300, '\x80')),
            "\"" + std::string(197, '\x80') + "...\" (300 bytes)");
}

TEST(QuotedNameTest, ControlCharactersQuotesAndBackslashesAreEscaped) {
  EXPECT_EQ(QuotedName("a\x1b[31mRED"), "\"a\\x1b[31mRED\"");
  EXPECT_EQ(QuotedName(std::string("nul\0end\nx\x7f", 10)), "\"nul\\x00end\\x0ax\\x7f\"");
  EXPECT_EQ(QuotedName("say \"hi\" \\ bye"), "\"say \\\"hi\\\" \\\\ bye\"");
  EXPECT_EQ(QuotedName("caf\xC3\xA9"), "\"caf\xC3\xA9\"");  // UTF-8 as it is
  // A long name: the first 200 bytes escaped (each ESC 4 bytes), then the whole size.
  std::string escaped;
  for (int i = 0; i < 200; ++i) escaped += "\\x1b";
  EXPECT_EQ(QuotedName(std::string(300, '\x1b')), "\"" + escaped + "...\" (300 bytes)");
}

// A server with no model (--model=) on the CPU backend, and a client of it.
class NoModelServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::CpuTestServer> started = testing::StartCpuTestServer({});
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(started->server);
    stub_ = std::move(started->stub);
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

TEST_F(NoModelServerTest, DequantizeOfAHugeNameIsNotFoundWithAShortMessage) {
  // Quoted whole, the 20000-byte name would exceed the client's 8 KiB metadata limit and the
  // client would see RESOURCE_EXHAUSTED instead of NOT_FOUND.
  v1::DequantizeRequest request;
  request.set_tensor(std::string(20000, 'n'));
  int messages = -1;
  const grpc::Status status = ReadAll(request, &v1::DequantService::Stub::Dequantize, &messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message().size();
  EXPECT_LT(status.error_message().size(), 1024u);
  EXPECT_THAT(status.error_message(), HasSubstr("tensor \"" + std::string(200, 'n') +
                                                "...\" (20000 bytes) is not a "
                                                "layer of the loaded model (no model is loaded)"));
  EXPECT_EQ(messages, 0);
}

}  // namespace
}  // namespace dequantd
