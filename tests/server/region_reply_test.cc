// The reply of an output_region call (issue 9): EncodeRegionReply's message (one header for
// Dequantize, every layer's header in layer_headers for DequantizeLayers, or the summary alone,
// issue 23), RegionReplyFromProto's checks, and, through a real
// gRPC server around DequantService with a backend that fails half-way, that a failed region call
// ends with the backend's status and no message at all.
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dequant/v1/dequant.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/metrics.h"
#include "server/rpc/grpc_result_sink.h"
#include "server/rpc/region_service.h"
#include "server/rpc/service.h"
#include "tests/regions/shm_file.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

// `message` parsed back as a DequantizeResponse.
v1::DequantizeResponse Parse(const grpc::ByteBuffer& message) {
  grpc::ByteBuffer copy(message);
  v1::DequantizeResponse response;
  EXPECT_TRUE(
      grpc::SerializationTraits<v1::DequantizeResponse>::Deserialize(&copy, &response).ok());
  return response;
}

TEST(EncodeRegionReplyTest, DequantizeIsOneHeaderNamingTheRegionAndOffset) {
  const std::vector<ResultLayer> results = {
      {.tensor = "", .shape = {.K = 256, .N = 384, .group_size = 64}}};
  absl::StatusOr<grpc::ByteBuffer> reply = EncodeRegionReply(
      results, RegionReplyKind::kHeader, DType::kBF16, "cpu", "cpu threads=2", "r", {4096});
  ASSERT_TRUE(reply.ok()) << reply.status();
  const v1::DequantizeResponse response = Parse(*reply);
  ASSERT_TRUE(response.has_header());
  EXPECT_EQ(response.layer_headers_size(), 0);
  EXPECT_EQ(response.offset(), 0);
  EXPECT_TRUE(response.data().empty());
  const v1::DequantizeHeader& h = response.header();
  EXPECT_THAT(h.shape(), ::testing::ElementsAre(256, 384));
  EXPECT_EQ(h.dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(h.total_bytes(), 256 * 384 * 2);
  EXPECT_EQ(h.backend(), "cpu");
  EXPECT_EQ(h.kernel(), "cpu threads=2");
  EXPECT_EQ(h.tensor(), "");
  EXPECT_EQ(h.region(), "r");
  EXPECT_EQ(h.region_offset(), 4096);
}

TEST(EncodeRegionReplyTest, DequantizeLayersCarriesEveryLayerHeaderInCallOrder) {
  const QuantShape a{.K = 128, .N = 256, .group_size = 64};
  const QuantShape b{.K = 64, .N = 512, .group_size = 32};
  const std::vector<ResultLayer> results = {
      {.tensor = "b", .shape = b}, {.tensor = "a", .shape = a}, {.tensor = "b", .shape = b}};
  const int64_t nb = 64 * 512 * 4, na = 128 * 256 * 4;
  absl::StatusOr<grpc::ByteBuffer> reply =
      EncodeRegionReply(results, RegionReplyKind::kLayerHeaders, DType::kF32, "cuda", "v4 grouped",
                        "layers", {32, 32 + nb, 32 + nb + na});
  ASSERT_TRUE(reply.ok()) << reply.status();
  const v1::DequantizeResponse response = Parse(*reply);
  EXPECT_FALSE(response.has_header());
  EXPECT_TRUE(response.data().empty());
  ASSERT_EQ(response.layer_headers_size(), 3);
  const std::vector<std::string> names = {"b", "a", "b"};
  const std::vector<int64_t> offsets = {32, 32 + nb, 32 + nb + na};
  const std::vector<int64_t> bytes = {nb, na, nb};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    const v1::DequantizeHeader& h = response.layer_headers(i);
    EXPECT_EQ(h.tensor(), names[i]);
    EXPECT_EQ(h.region(), "layers");
    EXPECT_EQ(h.region_offset(), offsets[i]);
    EXPECT_EQ(h.total_bytes(), bytes[i]);
    EXPECT_EQ(h.dtype(), v1::DTYPE_FP32);
    EXPECT_EQ(h.backend(), "cuda");
    EXPECT_EQ(h.kernel(), "v4 grouped");
  }
  EXPECT_THAT(response.layer_headers(1).shape(), ::testing::ElementsAre(128, 256));
}

TEST(EncodeRegionReplyTest, SummaryCarriesCountsAndNoHeaderWhateverTheLayerCount) {
  // 300 results of three shapes, (N, K): the summary is one small message with the count and the
  // sum of K * N * 2 (fp16) bytes, worked out here by hand, and the first result's offset.
  const QuantShape a{.K = 128, .N = 256, .group_size = 64, .orientation = Orientation::kNK};
  const QuantShape b{.K = 64, .N = 512, .group_size = 32, .orientation = Orientation::kNK};
  const QuantShape c{.K = 4096, .N = 1024, .group_size = 128, .orientation = Orientation::kNK};
  std::vector<ResultLayer> results;
  std::vector<int64_t> offsets;
  int64_t at = 4096;
  for (int i = 0; i < 100; ++i) {
    for (const QuantShape& shape : {a, b, c}) {
      results.push_back({.tensor = "", .shape = shape});
      offsets.push_back(at);
      at += shape.K * shape.N * 2;
    }
  }
  constexpr int64_t kTotal = 100 * (128 * 256 * 2 + 64 * 512 * 2 + 4096 * 1024 * 2);
  ASSERT_EQ(at - 4096, kTotal);
  absl::StatusOr<grpc::ByteBuffer> reply =
      EncodeRegionReply(results, RegionReplyKind::kSummary, DType::kF16, "cuda",
                        "grouped block=256", "model", offsets);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_LT(reply->Length(), 100u);  // the headers reply of these 300 results is ~30 KB
  const v1::DequantizeResponse response = Parse(*reply);
  EXPECT_FALSE(response.has_header());
  EXPECT_EQ(response.layer_headers_size(), 0);
  EXPECT_TRUE(response.data().empty());
  ASSERT_TRUE(response.has_region_summary());
  const v1::RegionSummary& summary = response.region_summary();
  EXPECT_EQ(summary.layer_count(), 300);
  EXPECT_EQ(summary.total_bytes(), kTotal);
  EXPECT_EQ(summary.region(), "model");
  EXPECT_EQ(summary.region_offset(), 4096);
  EXPECT_EQ(summary.dtype(), v1::DTYPE_FP16);
  EXPECT_EQ(summary.orientation(), v1::ORIENTATION_NK);
  EXPECT_EQ(summary.backend(), "cuda");
  EXPECT_EQ(summary.kernel(), "grouped block=256");
}

TEST(EncodeRegionReplyTest, OffsetsThatDoNotMatchTheResultsAreInternal) {
  const std::vector<ResultLayer> results = {{.tensor = "a", .shape = {.K = 8, .N = 8}}};
  for (RegionReplyKind kind : {RegionReplyKind::kLayerHeaders, RegionReplyKind::kSummary}) {
    EXPECT_EQ(
        EncodeRegionReply(results, kind, DType::kF16, "cpu", "k", "r", {0, 16}).status().code(),
        absl::StatusCode::kInternal);
  }
  const std::vector<ResultLayer> two = {results[0], results[0]};
  EXPECT_EQ(EncodeRegionReply(two, RegionReplyKind::kHeader, DType::kF16, "cpu", "k", "r", {0, 128})
                .status()
                .code(),
            absl::StatusCode::kInternal);
}

TEST(RegionReplyFromProtoTest, DefaultsToHeadersAndRefusesBadCombinationsNamingTheField) {
  EXPECT_EQ(*RegionReplyFromProto(v1::REGION_REPLY_UNSPECIFIED, true),
            RegionReplyKind::kLayerHeaders);
  EXPECT_EQ(*RegionReplyFromProto(v1::REGION_REPLY_HEADERS, true), RegionReplyKind::kLayerHeaders);
  EXPECT_EQ(*RegionReplyFromProto(v1::REGION_REPLY_SUMMARY, true), RegionReplyKind::kSummary);
  EXPECT_EQ(*RegionReplyFromProto(v1::REGION_REPLY_UNSPECIFIED, false),
            RegionReplyKind::kLayerHeaders);
  for (v1::RegionReply reply : {v1::REGION_REPLY_HEADERS, v1::REGION_REPLY_SUMMARY}) {
    const absl::Status s = RegionReplyFromProto(reply, /*has_output_region=*/false).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), ::testing::HasSubstr("region_reply"));
    EXPECT_THAT(s.message(), ::testing::HasSubstr("needs output_region"));
  }
  const absl::Status unknown =
      RegionReplyFromProto(static_cast<v1::RegionReply>(7), /*has_output_region=*/true).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), ::testing::HasSubstr("region_reply must be"));
  EXPECT_THAT(unknown.message(), ::testing::HasSubstr("got 7"));
}

// Dequantize writes the first half of the result into its sink, then fails with DATA_LOSS.
class HalfWayBackend final : public Backend {
 public:
  BackendInfo Info() const override {
    BackendInfo info;
    info.name = "halfway";
    return info;
  }
  absl::Status Prepare(const Checkpoint&) override { return absl::OkStatus(); }
  bool IsResident(const QuantizedLayer&) const override { return false; }
  absl::Status Dequantize(const DequantSource& source, DType out_dtype, int64_t,
                          ChunkSink& sink) override {
    if (absl::Status s = sink.Begin("halfway kernel"); !s.ok()) return s;
    const std::vector<uint8_t> half(static_cast<size_t>(source.shape().output_bytes(out_dtype) / 2),
                                    0x5A);
    if (absl::Status s = sink.Write(0, half); !s.ok()) return s;
    return absl::DataLossError("injected: the second half of the result was lost");
  }
};

class RegionReplyServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", "0.1.0");
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    metrics_ = std::move(*metrics);
    RegionServiceOptions region_options;
    region_options.mode = SharedMemoryMode::kHost;
    regions_ = std::make_unique<RegionService>(region_options, metrics_.get());
    ServiceOptions options;
    options.regions = regions_.get();
    service_ = std::make_unique<DequantService>(options, nullptr, &backend_, metrics_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::DequantService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  HalfWayBackend backend_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<RegionService> regions_;
  std::unique_ptr<DequantService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::DequantService::Stub> stub_;
};

TEST_F(RegionReplyServerTest, AnErrorMidCallEndsWithItsStatusAndNoMessage) {
  constexpr int64_t kK = 64, kN = 64, kBytes = kK * kN * 2;
  testing::ShmFile shm("reply", kBytes);
  ASSERT_TRUE(shm.ok());
  v1::RegisterSystemSharedMemoryRequest registration;
  registration.set_name("r");
  registration.set_key(shm.key());
  registration.set_byte_size(kBytes);
  v1::RegisterSystemSharedMemoryResponse registered;
  ASSERT_TRUE(regions_->RegisterSystem("unix:", registration, &registered).ok());

  v1::DequantizeRequest request;
  v1::InlinePackedTensor* packed = request.mutable_packed();
  packed->set_in_features(kK);
  packed->set_out_features(kN);
  packed->set_group_size(kK);
  packed->set_qweight(std::string(kK * kN / 2, '\0'));
  packed->set_qzeros(std::string(kN / 2, '\0'));
  packed->set_scales(std::string(kN * 2, '\0'));
  request.mutable_output_region()->set_name("r");
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> reader =
      stub_->Dequantize(&context, request);
  int messages = 0;
  v1::DequantizeResponse response;
  while (reader->Read(&response)) ++messages;
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(messages, 0);  // no header: the call failed
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(status.error_message(), "injected: the second half of the result was lost");
  // The first half did reach the region before the failure (the call's bytes are incomplete).
  EXPECT_EQ(shm.Read(0, kBytes / 2), std::string(kBytes / 2, '\x5A'));
}

}  // namespace
}  // namespace dequantd
