// Shared-memory regions end to end (issue 9) on a real server (CPU backend, 127.0.0.1): results
// written into a client's POSIX shared memory equal the streamed ones byte for byte, the reply is
// one message (the header, every layer's header, or with REGION_REPLY_SUMMARY the counts alone)
// naming the region and offsets, sent with the OK status, and every refusal has its precise
// status and no message.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/shm_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rpc/request.h"
#include "tests/integration/test_support.h"

namespace dequantd::testing {
namespace {

using ::testing::HasSubstr;

class SharedMemoryTest : public SharedServerSuite<SharedMemoryTest> {
 protected:
  static void SetUpTestSuite() {
    StartSharedServer("shared_memory",
                      {MakeRandomLayer("l0", 256, 384, 64, DType::kF16, 11),
                       MakeRandomLayer("l1", 128, 1024, 64, DType::kF16, 12)},
                      /*group_size=*/64, Options());
  }
  static ServerOptions Options() {
    ServerOptions options;
    options.shared_memory = "host";
    options.shared_memory_max_regions = 4;
    options.shared_memory_max_bytes = int64_t{64} << 20;
    return options;
  }
  void TearDown() override { (void)regions().UnregisterSystem(""); }

  static RegionClient& regions() {
    static RegionClient* client = new RegionClient(SharedMemoryTest::client().channel());
    return *client;
  }
  static std::unique_ptr<ShmObject> Shm(const std::string& name, int64_t bytes) {
    absl::StatusOr<std::unique_ptr<ShmObject>> shm =
        ShmObject::Create(absl::StrCat("/dequantd-it.", getpid(), ".", name), bytes);
    EXPECT_TRUE(shm.ok()) << shm.status();
    return shm.ok() ? std::move(*shm) : nullptr;
  }
  static std::vector<uint8_t> Bytes(const ShmObject& shm, int64_t offset, int64_t n) {
    return std::vector<uint8_t>(shm.data() + offset, shm.data() + offset + n);
  }
  // The reference result of `l` in (N, K): its (K, N) one transposed element by element.
  static std::vector<uint8_t> Transposed(const RandomLayer& l, DType dtype) {
    const std::vector<uint8_t> kn = l.Expected(dtype);
    const int64_t K = l.shape.K, N = l.shape.N, e = DTypeSize(dtype);
    std::vector<uint8_t> nk(kn.size());
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t n = 0; n < N; ++n) {
        std::memcpy(&nk[(n * K + k) * e], &kn[(k * N + n) * e], static_cast<size_t>(e));
      }
    }
    return nk;
  }
};

TEST_F(SharedMemoryTest, DequantizeIntoAHostRegionEqualsTheReference) {
  const RandomLayer& l = layer(0);
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t bytes = l.shape.output_bytes(dtype);
    std::unique_ptr<ShmObject> shm = Shm("one", 48 + bytes + 16);
    ASSERT_NE(shm, nullptr);
    absl::StatusOr<v1::RegisterSystemSharedMemoryResponse> registered =
        regions().RegisterSystem("one", shm->key(), 16, 32 + bytes + 16);
    ASSERT_TRUE(registered.ok()) << registered.status();
    EXPECT_FALSE(registered->pinned());  // the CPU backend does not pin

    v1::DequantizeRequest request;
    *request.mutable_packed() = l.ToInline();
    request.set_output_dtype(DTypeToProto(dtype));
    request.mutable_output_region()->set_name("one");
    request.mutable_output_region()->set_offset(32);
    absl::StatusOr<v1::DequantizeHeader> header = regions().DequantizeInto(request);
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->region(), "one");
    EXPECT_EQ(header->region_offset(), 32);
    EXPECT_EQ(header->total_bytes(), bytes);
    EXPECT_THAT(header->shape(), ::testing::ElementsAre(256, 384));
    // Region offset 32 is object offset 16 + 32.
    EXPECT_TRUE(Bytes(*shm, 48, bytes) == l.Expected(dtype));
    EXPECT_EQ(Bytes(*shm, 0, 48), std::vector<uint8_t>(48, 0));
    EXPECT_EQ(Bytes(*shm, 48 + bytes, 16), std::vector<uint8_t>(16, 0));
    ASSERT_EQ(*regions().UnregisterSystem("one"), 1);
  }
}

TEST_F(SharedMemoryTest, DequantizeLayersFillsOneRegionInRequestOrder) {
  const int64_t b0 = layer(0).shape.output_bytes(DType::kF16);
  const int64_t b1 = layer(1).shape.output_bytes(DType::kF16);
  std::unique_ptr<ShmObject> shm = Shm("layers", 64 + b1 + b0 + b1);
  ASSERT_NE(shm, nullptr);
  ASSERT_TRUE(regions().RegisterSystem("layers", shm->key(), 0, shm->bytes()).ok());
  v1::DequantizeLayersRequest request;
  for (const char* name : {"l1", "l0", "l1"}) request.add_tensors(name);
  request.mutable_output_region()->set_name("layers");
  request.mutable_output_region()->set_offset(64);
  absl::StatusOr<std::vector<v1::DequantizeHeader>> headers =
      regions().DequantizeLayersInto(request);
  ASSERT_TRUE(headers.ok()) << headers.status();
  ASSERT_EQ(headers->size(), 3u);
  EXPECT_EQ((*headers)[0].tensor(), "l1");
  EXPECT_EQ((*headers)[0].region_offset(), 64);
  EXPECT_EQ((*headers)[1].tensor(), "l0");
  EXPECT_EQ((*headers)[1].region_offset(), 64 + b1);
  EXPECT_EQ((*headers)[2].region_offset(), 64 + b1 + b0);
  EXPECT_TRUE(Bytes(*shm, 64, b1) == layer(1).Expected(DType::kF16));
  EXPECT_TRUE(Bytes(*shm, 64 + b1, b0) == layer(0).Expected(DType::kF16));
  EXPECT_TRUE(Bytes(*shm, 64 + b1 + b0, b1) == layer(1).Expected(DType::kF16));
}

// The wire form of a region call's reply, read with the generated stub (no client library): one
// message and then the OK status. For DequantizeLayers that message carries no `header` and no
// data, only layer_headers: one per requested layer, in request order.
TEST_F(SharedMemoryTest, ADequantizeLayersReplyIsOneMessageWithEveryLayerHeader) {
  const int64_t b0 = layer(0).shape.output_bytes(DType::kBF16);
  const int64_t b1 = layer(1).shape.output_bytes(DType::kBF16);
  std::unique_ptr<ShmObject> shm = Shm("wire", 16 + b0 + b1 + b0);
  ASSERT_NE(shm, nullptr);
  ASSERT_TRUE(regions().RegisterSystem("wire", shm->key(), 0, shm->bytes()).ok());
  v1::DequantizeLayersRequest request;
  for (const char* name : {"l0", "l1", "l0"}) request.add_tensors(name);
  request.set_output_dtype(v1::DTYPE_BF16);
  request.mutable_output_region()->set_name("wire");
  request.mutable_output_region()->set_offset(16);
  std::unique_ptr<v1::DequantService::Stub> stub = v1::DequantService::NewStub(client().channel());
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> reader =
      stub->DequantizeLayers(&context, request);
  std::vector<v1::DequantizeResponse> messages;
  v1::DequantizeResponse response;
  while (reader->Read(&response)) messages.push_back(response);
  const grpc::Status status = reader->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(messages.size(), 1u);
  const v1::DequantizeResponse& reply = messages.front();
  EXPECT_FALSE(reply.has_header());
  EXPECT_TRUE(reply.data().empty());
  EXPECT_EQ(reply.offset(), 0);
  ASSERT_EQ(reply.layer_headers_size(), 3);
  const std::vector<std::string> names = {"l0", "l1", "l0"};
  const std::vector<int64_t> offsets = {16, 16 + b0, 16 + b0 + b1};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    const v1::DequantizeHeader& h = reply.layer_headers(i);
    const RandomLayer& l = layer(names[i] == "l0" ? 0 : 1);
    EXPECT_EQ(h.tensor(), names[i]);
    EXPECT_THAT(h.shape(), ::testing::ElementsAre(l.shape.K, l.shape.N));
    EXPECT_EQ(h.dtype(), v1::DTYPE_BF16);
    EXPECT_EQ(h.total_bytes(), l.shape.output_bytes(DType::kBF16));
    EXPECT_EQ(h.backend(), "cpu");
    EXPECT_THAT(h.kernel(), ::testing::StartsWith("cpu"));
    EXPECT_EQ(h.region(), "wire");
    EXPECT_EQ(h.region_offset(), offsets[i]);
    EXPECT_TRUE(Bytes(*shm, offsets[i], h.total_bytes()) == l.Expected(DType::kBF16));
  }
  EXPECT_EQ(Bytes(*shm, 0, 16), std::vector<uint8_t>(16, 0));
}

// REGION_REPLY_SUMMARY (issue 23), read with the generated stub: one message, no header, no
// layer_headers, no data, only region_summary, whose count and total bytes equal the sums worked
// out here from the layers' K and N; the results lie where the placement rule puts them (one
// after another from the offset), byte-exact, and nothing outside them is written.
TEST_F(SharedMemoryTest, ASummaryReplyCarriesCountsAndTheResultsArePlacedByTheRule) {
  const int64_t b0 = 256 * 384 * 2, b1 = 128 * 1024 * 2;  // bf16: K * N * 2
  ASSERT_EQ(b0, layer(0).shape.output_bytes(DType::kBF16));
  ASSERT_EQ(b1, layer(1).shape.output_bytes(DType::kBF16));
  const int64_t offset = 48, total = b1 + b0 + b0 + b1;
  std::unique_ptr<ShmObject> shm = Shm("summary", offset + total + 32);
  ASSERT_NE(shm, nullptr);
  ASSERT_TRUE(regions().RegisterSystem("summary", shm->key(), 0, shm->bytes()).ok());
  v1::DequantizeLayersRequest request;
  for (const char* name : {"l1", "l0", "l0", "l1"}) request.add_tensors(name);
  request.set_output_dtype(v1::DTYPE_BF16);
  request.set_region_reply(v1::REGION_REPLY_SUMMARY);
  request.mutable_output_region()->set_name("summary");
  request.mutable_output_region()->set_offset(offset);
  std::unique_ptr<v1::DequantService::Stub> stub = v1::DequantService::NewStub(client().channel());
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> reader =
      stub->DequantizeLayers(&context, request);
  std::vector<v1::DequantizeResponse> messages;
  v1::DequantizeResponse response;
  while (reader->Read(&response)) messages.push_back(response);
  const grpc::Status status = reader->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(messages.size(), 1u);
  const v1::DequantizeResponse& reply = messages.front();
  EXPECT_FALSE(reply.has_header());
  EXPECT_EQ(reply.layer_headers_size(), 0);
  EXPECT_TRUE(reply.data().empty());
  ASSERT_TRUE(reply.has_region_summary());
  const v1::RegionSummary& summary = reply.region_summary();
  EXPECT_EQ(summary.layer_count(), 4);
  EXPECT_EQ(summary.total_bytes(), total);
  EXPECT_EQ(summary.region(), "summary");
  EXPECT_EQ(summary.region_offset(), offset);
  EXPECT_EQ(summary.dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(summary.orientation(), v1::ORIENTATION_KN);  // AWQ's own
  EXPECT_EQ(summary.backend(), "cpu");
  EXPECT_THAT(summary.kernel(), ::testing::StartsWith("cpu"));
  EXPECT_TRUE(Bytes(*shm, offset, b1) == layer(1).Expected(DType::kBF16));
  EXPECT_TRUE(Bytes(*shm, offset + b1, b0) == layer(0).Expected(DType::kBF16));
  EXPECT_TRUE(Bytes(*shm, offset + b1 + b0, b0) == layer(0).Expected(DType::kBF16));
  EXPECT_TRUE(Bytes(*shm, offset + b1 + 2 * b0, b1) == layer(1).Expected(DType::kBF16));
  EXPECT_EQ(Bytes(*shm, 0, offset), std::vector<uint8_t>(offset, 0));
  EXPECT_EQ(Bytes(*shm, offset + total, 32), std::vector<uint8_t>(32, 0));
}

// Through the client library: an empty list (every layer, in ListTensors order) in (N, K), and
// the explicit REGION_REPLY_HEADERS reply, which is the default's message exactly.
TEST_F(SharedMemoryTest, ASummaryOfEveryLayerInNkAndExplicitHeadersEqualTheDefault) {
  const int64_t b0 = layer(0).shape.output_bytes(DType::kF16);
  const int64_t b1 = layer(1).shape.output_bytes(DType::kF16);
  std::unique_ptr<ShmObject> shm = Shm("every", b0 + b1);
  ASSERT_NE(shm, nullptr);
  ASSERT_TRUE(regions().RegisterSystem("every", shm->key(), 0, shm->bytes()).ok());
  v1::DequantizeLayersRequest all;  // no names: every layer
  all.set_orientation(v1::ORIENTATION_NK);
  all.set_region_reply(v1::REGION_REPLY_SUMMARY);
  all.mutable_output_region()->set_name("every");
  absl::StatusOr<v1::RegionSummary> summary = regions().DequantizeLayersIntoSummary(all);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->layer_count(), 2);
  EXPECT_EQ(summary->total_bytes(), (256 * 384 + 128 * 1024) * 2);
  EXPECT_EQ(summary->orientation(), v1::ORIENTATION_NK);
  EXPECT_TRUE(Bytes(*shm, 0, b0) == Transposed(layer(0), DType::kF16));
  EXPECT_TRUE(Bytes(*shm, b0, b1) == Transposed(layer(1), DType::kF16));
  // The summary call refuses a request that asks for headers, and the headers call one that asks
  // for a summary, before any call.
  v1::DequantizeLayersRequest headers_request = all;
  headers_request.set_region_reply(v1::REGION_REPLY_HEADERS);
  EXPECT_EQ(regions().DequantizeLayersIntoSummary(headers_request).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(regions().DequantizeLayersInto(all).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Explicit HEADERS and the default (UNSPECIFIED) send the same message.
  std::unique_ptr<v1::DequantService::Stub> stub = v1::DequantService::NewStub(client().channel());
  const auto one_message = [&](const v1::DequantizeLayersRequest& request) {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> reader =
        stub->DequantizeLayers(&context, request);
    std::vector<std::string> messages;
    v1::DequantizeResponse response;
    while (reader->Read(&response)) messages.push_back(response.SerializeAsString());
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(messages.size(), 1u);
    return messages.empty() ? std::string() : messages.front();
  };
  v1::DequantizeLayersRequest by_default = all;
  by_default.clear_region_reply();
  const std::string default_reply = one_message(by_default);
  EXPECT_EQ(one_message(headers_request), default_reply);
  v1::DequantizeResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(default_reply));
  EXPECT_EQ(parsed.layer_headers_size(), 2);
  EXPECT_FALSE(parsed.has_region_summary());
}

// region_reply on a streamed call, or an unknown value, is INVALID_ARGUMENT naming the field,
// with no message and nothing written.
TEST_F(SharedMemoryTest, ABadRegionReplyIsInvalidArgumentNamingTheField) {
  const int64_t b0 = layer(0).shape.output_bytes(DType::kF16);
  std::unique_ptr<ShmObject> shm = Shm("bad-reply", b0);
  ASSERT_NE(shm, nullptr);
  ASSERT_TRUE(regions().RegisterSystem("bad-reply", shm->key(), 0, shm->bytes()).ok());
  std::unique_ptr<v1::DequantService::Stub> stub = v1::DequantService::NewStub(client().channel());
  const auto call = [&](const v1::DequantizeLayersRequest& request, int* messages) {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> reader =
        stub->DequantizeLayers(&context, request);
    v1::DequantizeResponse response;
    *messages = 0;
    while (reader->Read(&response)) ++*messages;
    return reader->Finish();
  };
  v1::DequantizeLayersRequest streamed;
  streamed.add_tensors("l0");
  for (v1::RegionReply reply : {v1::REGION_REPLY_SUMMARY, v1::REGION_REPLY_HEADERS}) {
    streamed.set_region_reply(reply);
    int messages = -1;
    const grpc::Status status = call(streamed, &messages);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("region_reply"));
    EXPECT_THAT(status.error_message(), HasSubstr("needs output_region"));
    EXPECT_EQ(messages, 0);
  }
  v1::DequantizeLayersRequest unknown;
  unknown.add_tensors("l0");
  unknown.mutable_output_region()->set_name("bad-reply");
  unknown.set_region_reply(static_cast<v1::RegionReply>(5));
  int messages = -1;
  const grpc::Status status = call(unknown, &messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("region_reply must be"));
  EXPECT_EQ(messages, 0);
  EXPECT_EQ(Bytes(*shm, 0, b0), std::vector<uint8_t>(b0, 0));  // nothing written
}

// Dequantize's reply: one message whose header names the region, then the OK status; an empty
// DequantizeLayers list means every layer of the model, in ListTensors order.
TEST_F(SharedMemoryTest, ADequantizeReplyIsOneHeaderAndAnEmptyListMeansEveryLayer) {
  const int64_t b0 = layer(0).shape.output_bytes(DType::kF16);
  const int64_t b1 = layer(1).shape.output_bytes(DType::kF16);
  std::unique_ptr<ShmObject> shm = Shm("one-message", b0 + b1);
  ASSERT_NE(shm, nullptr);
  ASSERT_TRUE(regions().RegisterSystem("m", shm->key(), 0, shm->bytes()).ok());
  v1::DequantizeRequest one;
  one.set_tensor("l1");
  one.mutable_output_region()->set_name("m");
  one.mutable_output_region()->set_offset(b0);
  std::unique_ptr<v1::DequantService::Stub> stub = v1::DequantService::NewStub(client().channel());
  {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> reader =
        stub->Dequantize(&context, one);
    std::vector<v1::DequantizeResponse> messages;
    v1::DequantizeResponse response;
    while (reader->Read(&response)) messages.push_back(response);
    ASSERT_TRUE(reader->Finish().ok());
    ASSERT_EQ(messages.size(), 1u);
    ASSERT_TRUE(messages[0].has_header());
    EXPECT_EQ(messages[0].layer_headers_size(), 0);
    EXPECT_TRUE(messages[0].data().empty());
    EXPECT_EQ(messages[0].header().region(), "m");
    EXPECT_EQ(messages[0].header().region_offset(), b0);
    EXPECT_EQ(messages[0].header().total_bytes(), b1);
    EXPECT_TRUE(Bytes(*shm, b0, b1) == layer(1).Expected(DType::kF16));
  }
  v1::DequantizeLayersRequest all;  // no names: every layer
  all.mutable_output_region()->set_name("m");
  absl::StatusOr<std::vector<v1::DequantizeHeader>> headers = regions().DequantizeLayersInto(all);
  ASSERT_TRUE(headers.ok()) << headers.status();
  ASSERT_EQ(headers->size(), 2u);
  EXPECT_EQ((*headers)[0].tensor(), "l0");
  EXPECT_EQ((*headers)[0].region_offset(), 0);
  EXPECT_EQ((*headers)[1].tensor(), "l1");
  EXPECT_EQ((*headers)[1].region_offset(), b0);
  EXPECT_TRUE(Bytes(*shm, 0, b0) == layer(0).Expected(DType::kF16));
}

// A refused region call ends with its status and no message (a header would mean success).
TEST_F(SharedMemoryTest, ARefusedDequantizeLayersSendsNoMessage) {
  const int64_t b0 = layer(0).shape.output_bytes(DType::kF16);
  std::unique_ptr<ShmObject> shm = Shm("refused", b0);
  ASSERT_NE(shm, nullptr);
  ASSERT_TRUE(regions().RegisterSystem("refused", shm->key(), 0, shm->bytes()).ok());
  std::unique_ptr<v1::DequantService::Stub> stub = v1::DequantService::NewStub(client().channel());
  const auto call = [&](const v1::DequantizeLayersRequest& request, int* messages) {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> reader =
        stub->DequantizeLayers(&context, request);
    v1::DequantizeResponse response;
    *messages = 0;
    while (reader->Read(&response)) ++*messages;
    return reader->Finish();
  };
  v1::DequantizeLayersRequest request;
  request.add_tensors("l0");
  request.add_tensors("l1");  // l0 + l1 do not fit
  request.mutable_output_region()->set_name("refused");
  int messages = -1;
  grpc::Status status = call(request, &messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("output_region: region \"refused\""));
  EXPECT_EQ(messages, 0);
  request.set_tensors(1, "no.such.layer");
  status = call(request, &messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(messages, 0);
  EXPECT_EQ(Bytes(*shm, 0, b0), std::vector<uint8_t>(b0, 0));  // nothing written
}

TEST_F(SharedMemoryTest, StatusListsRegionsWithTheirOwnerAndUnregisterReleasesThem) {
  std::unique_ptr<ShmObject> shm = Shm("status", 4096);
  ASSERT_NE(shm, nullptr);
  ASSERT_TRUE(regions().RegisterSystem("b", shm->key(), 0, 1024).ok());
  ASSERT_TRUE(regions().RegisterSystem("a", shm->key(), 1024, 2048).ok());
  absl::StatusOr<v1::SharedMemoryStatusResponse> status = regions().Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->mode(), "host");
  EXPECT_EQ(status->max_regions(), 4);
  ASSERT_EQ(status->regions_size(), 2);
  EXPECT_EQ(status->regions(0).name(), "a");  // sorted
  EXPECT_EQ(status->regions(0).kind(), "host");
  EXPECT_EQ(status->regions(0).key(), shm->key());
  EXPECT_EQ(status->regions(0).offset(), 1024);
  EXPECT_EQ(status->regions(0).byte_size(), 2048);
  EXPECT_EQ(status->regions(0).device_id(), -1);
  EXPECT_THAT(status->regions(0).owner(), HasSubstr("127.0.0.1"));
  EXPECT_EQ(status->regions(0).calls_in_flight(), 0);
  EXPECT_EQ(*regions().UnregisterSystem("a"), 1);
  absl::StatusOr<int> again = regions().UnregisterSystem("a");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*regions().UnregisterSystem(""), 1);
  EXPECT_EQ(regions().Status()->regions_size(), 0);
}

TEST_F(SharedMemoryTest, RegistrationErrorsAreExactAndNameTheField) {
  std::unique_ptr<ShmObject> shm = Shm("errors", 8192);
  ASSERT_NE(shm, nullptr);
  const auto code = [](const auto& result) { return result.status().code(); };
  auto r = regions().RegisterSystem("bad name", shm->key(), 0, 16);
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(NamesField(std::string(r.status().message()), "name")) << r.status();
  r = regions().RegisterSystem("x", shm->key(), 8, 16);
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(NamesField(std::string(r.status().message()), "offset")) << r.status();
  r = regions().RegisterSystem("x", shm->key(), 0, 0);
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(NamesField(std::string(r.status().message()), "byte_size")) << r.status();
  r = regions().RegisterSystem("x", "/etc/passwd", 0, 16);
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(NamesField(std::string(r.status().message()), "key")) << r.status();
  r = regions().RegisterSystem("x", "/dequantd-it-missing-object", 0, 16);
  EXPECT_EQ(code(r), absl::StatusCode::kNotFound);
  r = regions().RegisterSystem("x", shm->key(), 4096, 8192);
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("offset 4096 + byte_size 8192 runs past its end"));

  ASSERT_TRUE(regions().RegisterSystem("x", shm->key(), 0, 16).ok());
  EXPECT_EQ(code(regions().RegisterSystem("x", shm->key(), 0, 16)),
            absl::StatusCode::kAlreadyExists);
  // Limits: 4 regions, 64 MiB in all.
  r = regions().RegisterSystem("huge", shm->key(), 0, int64_t{65} << 20);
  EXPECT_EQ(code(r), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("--shared-memory-max-bytes"));
  for (const char* name : {"y", "z", "w"}) {
    ASSERT_TRUE(regions().RegisterSystem(name, shm->key(), 0, 16).ok());
  }
  r = regions().RegisterSystem("v", shm->key(), 0, 16);
  EXPECT_EQ(code(r), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("--shared-memory-max-regions"));

  // Device regions on the CPU backend (host mode: switched off first).
  const absl::Status cuda = regions().RegisterCuda("d", std::string(64, '\0'), 0, 0, 16);
  EXPECT_EQ(cuda.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cuda.message(), HasSubstr("--shared-memory=host"));
}

TEST_F(SharedMemoryTest, OutputRegionErrorsNameRegionOffsetAndBytes) {
  const RandomLayer& l = layer(0);
  const int64_t bytes = l.shape.output_bytes(DType::kF16);
  std::unique_ptr<ShmObject> shm = Shm("small", bytes);
  ASSERT_NE(shm, nullptr);
  ASSERT_TRUE(regions().RegisterSystem("small", shm->key(), 0, bytes).ok());
  v1::DequantizeRequest request;
  *request.mutable_packed() = l.ToInline();
  request.mutable_output_region()->set_name("small");
  request.mutable_output_region()->set_offset(16);  // 16 + bytes > bytes
  absl::StatusOr<v1::DequantizeHeader> header = regions().DequantizeInto(request);
  EXPECT_EQ(header.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(header.status().message(),
              HasSubstr(absl::StrCat("output_region: region \"small\" is ", bytes, " bytes; ",
                                     bytes, " bytes of results at offset 16 run past its end")));
  request.mutable_output_region()->set_offset(8);
  header = regions().DequantizeInto(request);
  EXPECT_EQ(header.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(header.status().message(), HasSubstr("multiple of 16"));
  request.mutable_output_region()->set_name("nope");
  header = regions().DequantizeInto(request);
  EXPECT_EQ(header.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(header.status().message(), HasSubstr("output_region.name: no region \"nope\""));
  // expected_bytes: the client's own total must be the results' (a stale listing's is refused).
  request.mutable_output_region()->set_name("small");
  request.mutable_output_region()->set_offset(0);
  request.mutable_output_region()->set_expected_bytes(bytes - 16);
  header = regions().DequantizeInto(request);
  EXPECT_EQ(header.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(header.status().message(),
              HasSubstr(absl::StrCat("output_region.expected_bytes = ", bytes - 16,
                                     ", but the results are ", bytes, " bytes (1 results)")));
  request.mutable_output_region()->set_expected_bytes(-1);
  header = regions().DequantizeInto(request);
  EXPECT_EQ(header.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(header.status().message(), HasSubstr("output_region.expected_bytes must be >= 0"));
  EXPECT_EQ(Bytes(*shm, 0, bytes), std::vector<uint8_t>(bytes, 0));  // nothing written
  request.mutable_output_region()->set_expected_bytes(bytes);
  header = regions().DequantizeInto(request);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_NE(Bytes(*shm, 0, bytes), std::vector<uint8_t>(bytes, 0));
}

// A client that truncates its object while the server writes into it (issue 9, the SIGBUS
// risk): every call ends OK or FAILED_PRECONDITION naming the truncation, never with the server
// dead (it runs in this process: a SIGBUS would end the test binary); a call after the truncation
// is FAILED_PRECONDITION; grown back, the region takes a whole correct result again.
TEST_F(SharedMemoryTest, TruncatingTheObjectDuringWritesFailsThoseCallsAndTheServerServesOn) {
  const RandomLayer big = MakeRandomLayer("big", 1024, 4096, 64, DType::kF16, 21);
  const int64_t bytes = big.shape.output_bytes(DType::kF16);  // 8 MiB: 8 chunks of 1 MiB
  std::unique_ptr<ShmObject> shm = Shm("truncated", bytes);
  ASSERT_NE(shm, nullptr);
  ASSERT_TRUE(regions().RegisterSystem("t", shm->key(), 0, bytes).ok());
  v1::DequantizeRequest request;
  *request.mutable_packed() = big.ToInline();
  request.mutable_output_region()->set_name("t");
  const std::string path = "/dev/shm" + shm->key();

  std::atomic<bool> stop{false};
  std::thread truncator([&] {  // shrinks and regrows the object as fast as it can
    while (!stop.load()) {
      ASSERT_EQ(truncate(path.c_str(), 4096), 0);
      std::this_thread::yield();
      ASSERT_EQ(truncate(path.c_str(), bytes), 0);
    }
  });
  int failed = 0;
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<v1::DequantizeHeader> header = regions().DequantizeInto(request);
    if (header.ok()) continue;
    ++failed;
    EXPECT_EQ(header.status().code(), absl::StatusCode::kFailedPrecondition) << header.status();
    EXPECT_THAT(header.status().message(), HasSubstr("region \"t\": its object"));
    EXPECT_THAT(header.status().message(), HasSubstr("was truncated"));
  }
  stop = true;
  truncator.join();
  std::printf("calls failed by a truncation: %d of 20\n", failed);

  ASSERT_EQ(truncate(path.c_str(), 4096), 0);
  absl::StatusOr<v1::DequantizeHeader> header = regions().DequantizeInto(request);
  EXPECT_EQ(header.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(header.status().message(), HasSubstr("was truncated to 4096 bytes"));

  ASSERT_EQ(truncate(path.c_str(), bytes), 0);
  header = regions().DequantizeInto(request);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_TRUE(Bytes(*shm, 0, bytes) == big.Expected(DType::kF16));
  EXPECT_TRUE(client().ListTensors().ok());  // and the other RPCs still answer
}

TEST(SharedMemoryOffTest, EverythingIsFailedPreconditionByDefault) {
  absl::StatusOr<std::unique_ptr<TestServer>> server = StartCpuServer({});
  ASSERT_TRUE(server.ok()) << server.status();
  RegionClient regions((*server)->client->channel());
  const absl::Status s = regions.RegisterSystem("x", "/dequantd-anything", 0, 16).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--shared-memory=off"));
  EXPECT_EQ(regions.UnregisterSystem("").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(regions.RegisterCuda("x", std::string(64, '\0'), 0, 0, 16).code(),
            absl::StatusCode::kFailedPrecondition);
  const RandomLayer l = MakeRandomLayer("x", 64, 64, 64, DType::kF16, 1);
  v1::DequantizeRequest request;
  *request.mutable_packed() = l.ToInline();
  request.mutable_output_region()->set_name("x");
  const absl::Status call = regions.DequantizeInto(request).status();
  EXPECT_EQ(call.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(call.message(), HasSubstr("output_region"));
  // The status RPC still answers (mode off, no regions).
  absl::StatusOr<v1::SharedMemoryStatusResponse> status = regions.Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->mode(), "off");
}

TEST(SharedMemoryOptionsTest, BadValuesAreInvalidArgumentNamingTheFlag) {
  const auto start = [](auto set) {
    ServerOptions options;
    set(options);
    return StartCpuServer(options).status();
  };
  absl::Status s = start([](ServerOptions& o) { o.shared_memory = "on"; });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--shared-memory"));
  s = start([](ServerOptions& o) { o.shared_memory_max_regions = -1; });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--shared-memory-max-regions"));
  s = start([](ServerOptions& o) { o.shared_memory_max_bytes = -1; });
  EXPECT_THAT(s.message(), HasSubstr("--shared-memory-max-bytes"));
  s = start([](ServerOptions& o) { o.shared_memory_idle_release_seconds = -0.5; });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--shared-memory-idle-release"));
}

}  // namespace
}  // namespace dequantd::testing
