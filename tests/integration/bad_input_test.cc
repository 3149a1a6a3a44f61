// Each bad input from issue 2's list gets its exact gRPC status code and a message naming the
// field, and the server keeps serving: a good request right after each bad one succeeds.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/test_support.h"

namespace dequantd::testing {
namespace {

constexpr int64_t kMaxRequestBytes = 256 << 10;  // the server's limit in this test

struct BadInput {
  std::string name;
  std::function<void(v1::DequantizeRequest*)> corrupt;  // applied to a good inline request
  absl::StatusCode code;
  std::string field;  // must appear as a whole word in the message
};

class BadInputTest : public ::testing::TestWithParam<BadInput> {
 protected:
  static void SetUpTestSuite() {
    good_ = new RandomLayer(MakeRandomLayer("good", 128, 64, 64, DType::kF16, 21));
    checkpoint_layer_ = new RandomLayer(
        MakeRandomLayer("model.layers.0.self_attn.o_proj", 64, 32, 32, DType::kF16, 22));
    const std::string dir = MakeTempDir("bad_input");
    ServerOptions options;
    options.max_request_bytes = kMaxRequestBytes;
    absl::StatusOr<std::unique_ptr<TestServer>> server =
        StartCpuServerOnCheckpoint(dir, {*checkpoint_layer_}, 32, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    delete good_;
    delete checkpoint_layer_;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr) << "server did not start"; }

  static v1::DequantizeRequest GoodInline() {
    v1::DequantizeRequest request;
    *request.mutable_packed() = good_->ToInline();
    return request;
  }

  // A good inline and a good named request both succeed with the reference result.
  static void ExpectServerStillServes() {
    absl::StatusOr<DequantizedTensor> inline_result =
        server_->client->DequantizeToMemory(GoodInline());
    ASSERT_TRUE(inline_result.ok()) << inline_result.status();
    EXPECT_TRUE(inline_result->data == good_->Expected(DType::kF16));
    v1::DequantizeRequest named;
    named.set_tensor(checkpoint_layer_->name);
    absl::StatusOr<DequantizedTensor> named_result = server_->client->DequantizeToMemory(named);
    ASSERT_TRUE(named_result.ok()) << named_result.status();
    EXPECT_TRUE(named_result->data == checkpoint_layer_->Expected(DType::kF16));
  }

  static RandomLayer* good_;
  static RandomLayer* checkpoint_layer_;
  static TestServer* server_;
};

RandomLayer* BadInputTest::good_ = nullptr;
RandomLayer* BadInputTest::checkpoint_layer_ = nullptr;
TestServer* BadInputTest::server_ = nullptr;

TEST_P(BadInputTest, ExactCodeNamesFieldAndServerKeepsServing) {
  const BadInput& bad = GetParam();
  v1::DequantizeRequest request = GoodInline();
  bad.corrupt(&request);
  int chunks = 0;
  DequantizeSink sink;
  sink.on_chunk = [&](int64_t, absl::Span<const uint8_t>) {
    ++chunks;
    return absl::OkStatus();
  };
  absl::StatusOr<v1::DequantizeHeader> header = server_->client->Dequantize(request, sink);
  ASSERT_FALSE(header.ok()) << "accepted a bad request";
  EXPECT_EQ(header.status().code(), bad.code) << header.status();
  EXPECT_TRUE(NamesField(std::string(header.status().message()), bad.field))
      << "message does not name '" << bad.field << "': " << header.status().message();
  EXPECT_EQ(chunks, 0) << "data was sent before the error";
  ExpectServerStillServes();
}

// Byte counts of `good_` (K=128, N=64, G=64, fp16): qweight 128*8*4 = 4096, qzeros 2*8*4 = 64,
// scales 2*64*2 = 256.
INSTANTIATE_TEST_SUITE_P(
    IssueTwoList, BadInputTest,
    ::testing::Values(
        BadInput{"K_not_multiple_of_group_size",
                 [](v1::DequantizeRequest* r) { r->mutable_packed()->set_group_size(48); },
                 absl::StatusCode::kInvalidArgument, "group_size"},
        BadInput{"group_size_zero",
                 [](v1::DequantizeRequest* r) { r->mutable_packed()->set_group_size(0); },
                 absl::StatusCode::kInvalidArgument, "group_size"},
        BadInput{"N_not_multiple_of_8",
                 [](v1::DequantizeRequest* r) { r->mutable_packed()->set_out_features(60); },
                 absl::StatusCode::kInvalidArgument, "N"},
        BadInput{"K_zero",
                 [](v1::DequantizeRequest* r) { r->mutable_packed()->set_in_features(0); },
                 absl::StatusCode::kInvalidArgument, "K"},
        BadInput{
            "qweight_bytes_short",
            [](v1::DequantizeRequest* r) { r->mutable_packed()->mutable_qweight()->resize(4092); },
            absl::StatusCode::kInvalidArgument, "packed.qweight"},
        BadInput{"scales_bytes_long",
                 [](v1::DequantizeRequest* r) {
                   r->mutable_packed()->mutable_scales()->append(2, '\0');
                 },
                 absl::StatusCode::kInvalidArgument, "packed.scales"},
        BadInput{"qweight_empty",
                 [](v1::DequantizeRequest* r) { r->mutable_packed()->clear_qweight(); },
                 absl::StatusCode::kInvalidArgument, "packed.qweight"},
        // qzeros/scales shaped for G = 32 (4 groups) while qweight's G is 64 (2 groups).
        BadInput{"qzeros_inconsistent_with_qweight",
                 [](v1::DequantizeRequest* r) {
                   r->mutable_packed()->mutable_qzeros()->append(64, '\0');
                 },
                 absl::StatusCode::kInvalidArgument, "packed.qzeros"},
        BadInput{"scales_inconsistent_with_qweight",
                 [](v1::DequantizeRequest* r) {
                   r->mutable_packed()->mutable_scales()->append(256, '\0');
                 },
                 absl::StatusCode::kInvalidArgument, "packed.scales"},
        // A shape claiming twice the rows: qweight's bytes no longer match K.
        BadInput{"shape_inconsistent_with_qweight_bytes",
                 [](v1::DequantizeRequest* r) { r->mutable_packed()->set_in_features(256); },
                 absl::StatusCode::kInvalidArgument, "packed.qweight"},
        BadInput{"unknown_layer",
                 [](v1::DequantizeRequest* r) { r->set_tensor("model.layers.99.mlp.up_proj"); },
                 absl::StatusCode::kNotFound, "model.layers.99.mlp.up_proj"},
        BadInput{"output_dtype_int32",
                 [](v1::DequantizeRequest* r) { r->set_output_dtype(v1::DTYPE_INT32); },
                 absl::StatusCode::kInvalidArgument, "output_dtype"},
        BadInput{"output_dtype_unknown_number",
                 [](v1::DequantizeRequest* r) { r->set_output_dtype(static_cast<v1::DType>(77)); },
                 absl::StatusCode::kInvalidArgument, "output_dtype"},
        BadInput{"named_layer_output_dtype_int32",
                 [](v1::DequantizeRequest* r) {
                   r->set_tensor("model.layers.0.self_attn.o_proj");
                   r->set_output_dtype(v1::DTYPE_INT32);
                 },
                 absl::StatusCode::kInvalidArgument, "output_dtype"},
        BadInput{
            "scale_dtype_fp32",
            [](v1::DequantizeRequest* r) { r->mutable_packed()->set_scale_dtype(v1::DTYPE_FP32); },
            absl::StatusCode::kInvalidArgument, "packed.scale_dtype"},
        BadInput{"request_larger_than_max_request_bytes",
                 [](v1::DequantizeRequest* r) {
                   // K=8192, N=64, G=64: 262144 + 4096 + 16384 bytes > 256 KiB, shapes consistent.
                   *r->mutable_packed() =
                       MakeRandomLayer("big", 8192, 64, 64, DType::kF16, 23).ToInline();
                 },
                 absl::StatusCode::kResourceExhausted, "max_request_bytes"},
        BadInput{"no_source_set", [](v1::DequantizeRequest* r) { r->clear_source(); },
                 absl::StatusCode::kInvalidArgument, "source"}),
    [](const ::testing::TestParamInfo<BadInput>& info) { return info.param.name; });

// The limit is on the inline bytes; a request just under it is served.
TEST_F(BadInputTest, RequestJustUnderMaxRequestBytesIsServed) {
  // K=7168, N=64, G=64: 229376 + 3584 + 14336 = 247296 bytes <= 262144.
  const RandomLayer l = MakeRandomLayer("under", 7168, 64, 64, DType::kF16, 24);
  v1::DequantizeRequest request;
  *request.mutable_packed() = l.ToInline();
  absl::StatusOr<DequantizedTensor> result = server_->client->DequantizeToMemory(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->data == l.Expected(DType::kF16));
}

}  // namespace
}  // namespace dequantd::testing
