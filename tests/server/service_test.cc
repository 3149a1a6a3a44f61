// Tests for the running service: DequantServer::Start in-process on 127.0.0.1 with ephemeral
// ports and the CPU backend, driven through the raw generated stub. Checks the header and chunks
// of an inline Dequantize against DequantizeReference, each bad request's exact code and field,
// that the server keeps serving after each, the gRPC receive limit (our RESOURCE_EXHAUSTED, not
// gRPC's), cancellation, and the /metrics text.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "dequant/v1/dequant.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/dequant.h"
#include "server/model/checkpoint.h"
#include "server/server.h"
#include "tests/server/cpu_test_server.h"
#include "tests/server/test_layer.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;
using ::dequantd::testing::RandomPackedLayer;
using ::dequantd::testing::ReferenceBytes;
using ::dequantd::testing::ToInline;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// GET http://127.0.0.1:port/metrics; the whole response (headers included), or "" on failure.
std::string HttpGetMetrics(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) response.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return response;
}

// The header and the concatenated data of one Dequantize call.
struct Result {
  grpc::Status status;
  std::vector<v1::DequantizeHeader> headers;  // one per message that carried a header
  bool header_first = false;
  std::vector<int64_t> chunk_sizes;
  size_t max_message_bytes = 0;  // the largest serialized message received (ByteSizeLong)
  bool offsets_consecutive = true;
  std::vector<uint8_t> bytes;
};

class ServiceTest : public ::testing::Test {
 protected:
  // `with_metrics`: also serve /metrics (stopping civetweb's HTTP server takes about 2 s).
  void StartServer(ServerOptions options, bool with_metrics = false) {
    absl::StatusOr<testing::CpuTestServer> started =
        testing::StartCpuTestServer(std::move(options), with_metrics);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(started->server);
    ASSERT_GT(server_->port(), 0);
    channel_ = std::move(started->channel);
    stub_ = std::move(started->stub);
  }

  Result Dequantize(const v1::DequantizeRequest& request) {
    Result result;
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> reader =
        stub_->Dequantize(&context, request);
    v1::DequantizeResponse response;
    bool first = true;
    while (reader->Read(&response)) {
      result.max_message_bytes = std::max(result.max_message_bytes, response.ByteSizeLong());
      if (response.has_header()) {
        result.headers.push_back(response.header());
        if (first) result.header_first = true;
      }
      if (!response.data().empty()) {
        if (response.offset() != static_cast<int64_t>(result.bytes.size())) {
          result.offsets_consecutive = false;
        }
        result.chunk_sizes.push_back(static_cast<int64_t>(response.data().size()));
        result.bytes.insert(result.bytes.end(), response.data().begin(), response.data().end());
      }
      first = false;
    }
    result.status = reader->Finish();
    return result;
  }

  // The server still answers.
  void ExpectServing() {
    grpc::ClientContext context;
    v1::GetServerInfoResponse info;
    EXPECT_TRUE(stub_->GetServerInfo(&context, {}, &info).ok());
  }

  std::unique_ptr<DequantServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::DequantService::Stub> stub_;
};

TEST_F(ServiceTest, ServerInfoAndEmptyListWithoutModel) {
  StartServer({}, /*with_metrics=*/true);
  EXPECT_EQ(server_->backend_name(), "cpu");
  EXPECT_EQ(server_->layer_count(), 0);
  EXPECT_GT(server_->metrics_port(), 0);

  grpc::ClientContext info_context;
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(stub_->GetServerInfo(&info_context, {}, &info).ok());
  EXPECT_EQ(info.version(), "0.1.0");
  EXPECT_EQ(info.backend(), "cpu");
  EXPECT_EQ(info.tensor_count(), 0);
  EXPECT_EQ(info.cpu_threads(), 1);
  ASSERT_EQ(info.devices_size(), 1);
  EXPECT_EQ(info.devices(0).label(), "cpu");
  EXPECT_TRUE(info.devices(0).serving());
  EXPECT_EQ(info.devices(0).failure(), "");
  EXPECT_EQ(info.devices(0).calls_in_flight(), 0);

  grpc::ClientContext list_context;
  v1::ListTensorsResponse list;
  ASSERT_TRUE(stub_->ListTensors(&list_context, {}, &list).ok());
  EXPECT_EQ(list.tensors_size(), 0);
}

TEST_F(ServiceTest, InlineDequantizeStreamsHeaderThenReferenceBytes) {
  StartServer({});
  // K = 256, N = 256, G = 64, fp32 out: 256 KiB. chunk_bytes 1 is clamped to 64 KiB: 4 chunks.
  const testing::PackedLayer layer = RandomPackedLayer({.K = 256, .N = 256, .group_size = 64}, 11);
  v1::DequantizeRequest request;
  *request.mutable_packed() = ToInline(layer, 64);
  request.set_output_dtype(v1::DTYPE_FP32);
  request.set_chunk_bytes(1);
  const Result result = Dequantize(request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.headers.size(), 1u);
  EXPECT_TRUE(result.header_first);
  const v1::DequantizeHeader& header = result.headers[0];
  EXPECT_THAT(header.shape(), ::testing::ElementsAre(256, 256));
  EXPECT_EQ(header.dtype(), v1::DTYPE_FP32);
  EXPECT_EQ(header.total_bytes(), 256 * 256 * 4);
  EXPECT_EQ(header.backend(), "cpu");
  EXPECT_EQ(header.kernel(), "cpu threads=1");
  EXPECT_THAT(result.chunk_sizes, ::testing::ElementsAre(65536, 65536, 65536, 65536));
  EXPECT_TRUE(result.offsets_consecutive);
  EXPECT_TRUE(result.bytes == ReferenceBytes(layer, DType::kF32));
}

// orientation NK: the header reports (N, K) and ORIENTATION_NK, the bytes are the (K, N)
// reference's exact transpose (element by element), and a byte range is a range of the (N, K)
// result. KN and UNSPECIFIED (awq_gemm's own) give the (K, N) bytes.
TEST_F(ServiceTest, InlineDequantizeNkStreamsTheTransposeWithItsHeader) {
  StartServer({});
  const testing::PackedLayer layer = RandomPackedLayer({.K = 256, .N = 64, .group_size = 64}, 21);
  const std::vector<uint8_t> kn = ReferenceBytes(layer, DType::kBF16);
  std::vector<uint8_t> nk(kn.size());
  for (int64_t k = 0; k < 256; ++k)
    for (int64_t n = 0; n < 64; ++n) std::memcpy(&nk[(n * 256 + k) * 2], &kn[(k * 64 + n) * 2], 2);
  v1::DequantizeRequest request;
  *request.mutable_packed() = ToInline(layer, 64);
  request.set_output_dtype(v1::DTYPE_BF16);
  request.set_orientation(v1::ORIENTATION_NK);
  const Result result = Dequantize(request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.headers.size(), 1u);
  EXPECT_THAT(result.headers[0].shape(), ::testing::ElementsAre(64, 256));
  EXPECT_EQ(result.headers[0].orientation(), v1::ORIENTATION_NK);
  EXPECT_TRUE(result.bytes == nk);
  // Rows 3..4 of the (64, 256) result: bytes [3 * 512, 5 * 512).
  request.set_offset(3 * 512);
  request.set_length(2 * 512);
  const Result range = Dequantize(request);
  ASSERT_TRUE(range.status.ok()) << range.status.error_message();
  EXPECT_TRUE(range.bytes == std::vector<uint8_t>(nk.begin() + 3 * 512, nk.begin() + 5 * 512));
  for (v1::Orientation o : {v1::ORIENTATION_KN, v1::ORIENTATION_UNSPECIFIED}) {
    request.set_offset(0);
    request.set_length(0);
    request.set_orientation(o);
    const Result own = Dequantize(request);
    ASSERT_TRUE(own.status.ok()) << own.status.error_message();
    EXPECT_THAT(own.headers[0].shape(), ::testing::ElementsAre(256, 64));
    EXPECT_EQ(own.headers[0].orientation(), v1::ORIENTATION_KN);
    EXPECT_TRUE(own.bytes == kn);
  }
}

TEST_F(ServiceTest, LargestChunkMessageFitsGrpcsDefaultFourMiBLimit) {
  StartServer({});
  // K = 2048, N = 2048, fp32 out: 16 MiB. chunk_bytes 1 GiB is clamped to 4 MiB - 4 KiB =
  // 4190208: four full chunks and a last one of 16777216 - 4 * 4190208 = 16384 bytes.
  const testing::PackedLayer layer =
      RandomPackedLayer({.K = 2048, .N = 2048, .group_size = 128}, 12);
  v1::DequantizeRequest request;
  *request.mutable_packed() = ToInline(layer, 128);
  request.set_output_dtype(v1::DTYPE_FP32);
  request.set_chunk_bytes(int64_t{1} << 30);
  const Result result = Dequantize(request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_THAT(result.chunk_sizes,
              ::testing::ElementsAre(4190208, 4190208, 4190208, 4190208, 16384));
  // Every message, payload plus offset and field tags, within gRPC's default 4 MiB receive limit.
  EXPECT_GT(result.max_message_bytes, 4190208u);
  EXPECT_LE(result.max_message_bytes, size_t{4} << 20);
  EXPECT_TRUE(result.offsets_consecutive);
  EXPECT_TRUE(result.bytes == ReferenceBytes(layer, DType::kF32));
}

TEST_F(ServiceTest, UnspecifiedOutputDtypeIsFp16AndGroupSizeMinusOneIsK) {
  StartServer({});
  const testing::PackedLayer layer =
      RandomPackedLayer({.K = 128, .N = 40, .group_size = 128, .scale_dtype = DType::kBF16}, 12);
  v1::DequantizeRequest request;
  *request.mutable_packed() = ToInline(layer, -1);
  const Result result = Dequantize(request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.headers.size(), 1u);
  EXPECT_EQ(result.headers[0].dtype(), v1::DTYPE_FP16);
  EXPECT_TRUE(result.bytes == ReferenceBytes(layer, DType::kF16));
}

struct BadRequest {
  const char* name;
  v1::DequantizeRequest (*make)();
  grpc::StatusCode code;
  const char* field;
};

v1::DequantizeRequest ValidInline() {
  v1::DequantizeRequest request;
  *request.mutable_packed() =
      ToInline(RandomPackedLayer({.K = 256, .N = 16, .group_size = 128}, 13), 128);
  return request;
}

class ServiceBadRequestTest : public ServiceTest,
                              public ::testing::WithParamInterface<BadRequest> {};

TEST_P(ServiceBadRequestTest, ExactCodeNamingTheFieldAndStillServing) {
  ServerOptions options;
  options.max_output_bytes = 1 << 20;
  StartServer(options);
  const Result result = Dequantize(GetParam().make());
  EXPECT_EQ(result.status.error_code(), GetParam().code) << result.status.error_message();
  EXPECT_THAT(result.status.error_message(), HasSubstr(GetParam().field));
  EXPECT_TRUE(result.headers.empty());
  EXPECT_TRUE(result.bytes.empty());
  ExpectServing();
}

INSTANTIATE_TEST_SUITE_P(
    Requests, ServiceBadRequestTest,
    ::testing::Values(
        BadRequest{"UnknownTensor",
                   [] {
                     v1::DequantizeRequest r;
                     r.set_tensor("model.layers.99.mlp.up_proj");
                     return r;
                   },
                   grpc::StatusCode::NOT_FOUND, "\"model.layers.99.mlp.up_proj\""},
        BadRequest{"SourceNotSet", [] { return v1::DequantizeRequest(); },
                   grpc::StatusCode::INVALID_ARGUMENT, "source"},
        BadRequest{"Int32Output",
                   [] {
                     v1::DequantizeRequest r = ValidInline();
                     r.set_output_dtype(v1::DTYPE_INT32);
                     return r;
                   },
                   grpc::StatusCode::INVALID_ARGUMENT, "output_dtype"},
        BadRequest{"UnknownOrientation",
                   [] {
                     v1::DequantizeRequest r = ValidInline();
                     r.set_orientation(static_cast<v1::Orientation>(7));
                     return r;
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "orientation must be ORIENTATION_UNSPECIFIED, ORIENTATION_KN or "
                   "ORIENTATION_NK, got 7"},
        BadRequest{"QweightLength",
                   [] {
                     v1::DequantizeRequest r = ValidInline();
                     r.mutable_packed()->mutable_qweight()->resize(100);
                     return r;
                   },
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "packed.qweight has 100 bytes, expected 2048"},
        BadRequest{"ScalesLength",
                   [] {
                     v1::DequantizeRequest r = ValidInline();
                     r.mutable_packed()->mutable_scales()->append("xx");
                     return r;
                   },
                   grpc::StatusCode::INVALID_ARGUMENT, "packed.scales has 66 bytes, expected 64"},
        BadRequest{"NNotMultipleOf8",
                   [] {
                     v1::DequantizeRequest r = ValidInline();
                     r.mutable_packed()->set_out_features(20);
                     return r;
                   },
                   grpc::StatusCode::INVALID_ARGUMENT, "N must be a positive multiple of 8"},
        BadRequest{"KNotMultipleOfGroupSize",
                   [] {
                     v1::DequantizeRequest r = ValidInline();
                     r.mutable_packed()->set_group_size(96);
                     return r;
                   },
                   grpc::StatusCode::INVALID_ARGUMENT, "must be a multiple of group_size (96)"},
        // K = 4096, N = 128 fp32 out: 2 MiB > max_output_bytes 1 MiB (inputs are consistent).
        BadRequest{"OutputTooLarge",
                   [] {
                     v1::DequantizeRequest r;
                     *r.mutable_packed() = ToInline(
                         RandomPackedLayer({.K = 4096, .N = 128, .group_size = 128}, 14), 128);
                     r.set_output_dtype(v1::DTYPE_FP32);
                     return r;
                   },
                   grpc::StatusCode::RESOURCE_EXHAUSTED, "max_output_bytes = 1048576"}),
    [](const ::testing::TestParamInfo<BadRequest>& info) { return std::string(info.param.name); });

// A request above max_request_bytes (and above gRPC's default 4 MiB receive limit) is answered by
// our check, with the limit named, not by gRPC's generic message-size error.
TEST_F(ServiceTest, RequestAboveMaxRequestBytesIsResourceExhaustedNamingTheLimit) {
  ServerOptions options;
  options.max_request_bytes = 5 << 20;
  StartServer(options);
  // K = 8192, N = 1024: qweight 4 MiB + qzeros 64 KiB + scales 128 KiB (G = 128) is under the
  // limit and served; with N = 1280 it is 5.25 MiB, over it.
  {
    v1::DequantizeRequest request;
    *request.mutable_packed() =
        ToInline(RandomPackedLayer({.K = 8192, .N = 1024, .group_size = 128}, 15), 128);
    const Result ok = Dequantize(request);
    EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  }
  v1::DequantizeRequest request;
  *request.mutable_packed() =
      ToInline(RandomPackedLayer({.K = 8192, .N = 1280, .group_size = 128}, 16), 128);
  const Result result = Dequantize(request);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(result.status.error_message(), HasSubstr("max_request_bytes = 5242880"));
  ExpectServing();
}

TEST_F(ServiceTest, BenchmarkIsServedAndValidatesItsRequest) {
  StartServer({});
  grpc::ClientContext context;
  v1::BenchmarkRequest request;
  request.set_trials(101);  // refused before any work (the RPC itself: benchmark_service_test.cc)
  v1::BenchmarkResponse response;
  const grpc::Status status = stub_->Benchmark(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("trials"));
}

TEST_F(ServiceTest, BenchmarkPastTheClientDeadlineStopsAndFreesTheServer) {
  StartServer({});
  // 10 trials x 100 runs of 4096 x 4096 on one thread: minutes of work if it ran to the end
  // (then this test fails below, and its teardown waits for the benchmark to finish).
  v1::BenchmarkRequest big;
  v1::BenchmarkShape* shape = big.add_shapes();
  shape->set_in_features(4096);
  shape->set_out_features(4096);
  big.set_trials(10);
  big.set_runs(100);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
    v1::BenchmarkResponse response;
    EXPECT_EQ(stub_->Benchmark(&context, big, &response).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // The abandoned benchmark stops within one timed call and frees the server for the next one:
  // a small benchmark is refused (RESOURCE_EXHAUSTED "already running") only until then.
  v1::BenchmarkRequest small;
  shape = small.add_shapes();
  shape->set_in_features(128);
  shape->set_out_features(256);
  small.set_trials(1);
  small.set_runs(1);
  grpc::Status status;
  v1::BenchmarkResponse response;
  for (int attempt = 0; attempt < 300; ++attempt) {
    grpc::ClientContext context;
    response.Clear();
    status = stub_->Benchmark(&context, small, &response);
    if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    EXPECT_THAT(status.error_message(), HasSubstr("a benchmark is already running"));
    usleep(100 * 1000);
  }
  ASSERT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
  ASSERT_GT(response.rows_size(), 0);
  EXPECT_EQ(response.rows(0).in_features(), 128);
  EXPECT_EQ(response.rows(0).out_features(), 256);
}

TEST_F(ServiceTest, ClientCancellationEndsTheCall) {
  StartServer({}, /*with_metrics=*/true);
  // 2048 x 2048 fp32 = 16 MiB in 64 KiB chunks: far more than the transport buffers.
  const testing::PackedLayer layer =
      RandomPackedLayer({.K = 2048, .N = 2048, .group_size = 128}, 17);
  v1::DequantizeRequest request;
  *request.mutable_packed() = ToInline(layer, 128);
  request.set_output_dtype(v1::DTYPE_FP32);
  request.set_chunk_bytes(64 << 10);
  grpc::ClientContext context;
  auto reader = stub_->Dequantize(&context, request);
  v1::DequantizeResponse response;
  ASSERT_TRUE(reader->Read(&response));  // header
  ASSERT_TRUE(reader->Read(&response));  // first chunk
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The server-side handler ends with CANCELLED (not after sending all 16 MiB): wait for it to
  // be counted, then check how much it sent.
  // Waits for both counters themselves: a scrape racing with the handler's end can show some of
  // its series and not others (the H200 host once showed the duration histogram's count, which a
  // looser pattern matched, without the counters).
  const std::string requests =
      "dequantd_rpc_requests_total{code=\"CANCELLED\",method=\"Dequantize\"} 1";
  const std::string errors =
      "dequantd_rpc_errors_total{code=\"CANCELLED\",method=\"Dequantize\"} 1";
  std::string metrics;
  for (int i = 0; i < 200; ++i) {
    metrics = HttpGetMetrics(server_->metrics_port());
    if (metrics.find(requests) != std::string::npos && metrics.find(errors) != std::string::npos) {
      break;
    }
    usleep(50 * 1000);
  }
  EXPECT_THAT(metrics, HasSubstr(requests));
  EXPECT_THAT(metrics, HasSubstr(errors));
  ExpectServing();
}

TEST_F(ServiceTest, MetricsCountRequestsByMethodAndCode) {
  StartServer({}, /*with_metrics=*/true);
  ExpectServing();  // GetServerInfo OK
  v1::DequantizeRequest unknown;
  unknown.set_tensor("nope");
  EXPECT_EQ(Dequantize(unknown).status.error_code(), grpc::StatusCode::NOT_FOUND);
  const testing::PackedLayer layer = RandomPackedLayer({.K = 64, .N = 64, .group_size = 64}, 18);
  v1::DequantizeRequest request;
  *request.mutable_packed() = ToInline(layer, 64);
  ASSERT_TRUE(Dequantize(request).status.ok());

  const std::string metrics = HttpGetMetrics(server_->metrics_port());
  EXPECT_THAT(metrics, HasSubstr("200 OK"));
  EXPECT_THAT(metrics,
              HasSubstr("dequantd_rpc_requests_total{code=\"OK\",method=\"GetServerInfo\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("dequantd_rpc_requests_total{code=\"NOT_FOUND\",method="
                                 "\"Dequantize\"} 1"));
  EXPECT_THAT(metrics,
              HasSubstr("dequantd_rpc_requests_total{code=\"OK\",method=\"Dequantize\"} 1"));
  // Errors: only the NOT_FOUND call.
  EXPECT_THAT(metrics, HasSubstr("dequantd_rpc_errors_total{code=\"NOT_FOUND\",method="
                                 "\"Dequantize\"} 1"));
  EXPECT_THAT(metrics, Not(HasSubstr("dequantd_rpc_errors_total{code=\"OK\"")));
  EXPECT_THAT(metrics, HasSubstr("dequantd_rpc_duration_seconds_count{code=\"OK\",method="
                                 "\"Dequantize\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("dequantd_rpc_duration_seconds_count{code=\"NOT_FOUND\","
                                 "method=\"Dequantize\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("dequantd_rpc_in_flight{method=\"Dequantize\"} 0"));
  EXPECT_THAT(metrics, HasSubstr("dequantd_rpc_in_flight{method=\"Benchmark\"} 0"));
  // 64 * 64 fp16 = 8192 bytes sent and written by the kernel, which read qweight 64 * 8 * 4 =
  // 2048 + qzeros 1 * 8 * 4 = 32 + scales 1 * 64 * 2 = 128 bytes.
  EXPECT_THAT(metrics, HasSubstr("dequantd_dequantize_output_bytes_total 8192"));
  EXPECT_THAT(
      metrics,
      HasSubstr("dequantd_kernel_written_bytes_total{backend=\"cpu\",variant=\"cpu\"} 8192"));
  EXPECT_THAT(metrics,
              HasSubstr("dequantd_kernel_read_bytes_total{backend=\"cpu\",variant=\"cpu\"} 2208"));
  EXPECT_THAT(metrics, HasSubstr("dequantd_kernel_duration_seconds_count{variant=\"cpu\"} 1"));
  // The CPU backend times the kernel and send stages of the one call that reached it.
  EXPECT_THAT(metrics,
              HasSubstr("dequantd_dequantize_stage_duration_seconds_count{stage=\"kernel\"} 1"));
  EXPECT_THAT(metrics,
              HasSubstr("dequantd_dequantize_stage_duration_seconds_count{stage=\"send\"} 1"));
  EXPECT_THAT(metrics, Not(HasSubstr("stage=\"queue_wait\"")));
  EXPECT_THAT(metrics,
              HasSubstr("dequantd_device_copy_bandwidth_bytes_per_second{device=\"cpu\"}"));
  EXPECT_THAT(metrics, HasSubstr("dequantd_kernel_bandwidth_fraction{device=\"cpu\"}"));
  EXPECT_THAT(metrics, HasSubstr("dequantd_device_memory_used_bytes{device=\"cpu\",kind="
                                 "\"buffers\"} 0"));
  EXPECT_THAT(metrics, HasSubstr("dequantd_autotune_cache_hits_total 0"));
  EXPECT_THAT(metrics, HasSubstr("dequantd_autotune_cache_misses_total 0"));
  EXPECT_THAT(metrics, HasSubstr("dequantd_model_layers 0"));
  EXPECT_THAT(metrics, AllOf(HasSubstr("dequantd_build_info{"), HasSubstr("version=\"0.1.0\"")));
  EXPECT_THAT(metrics, AllOf(HasSubstr("dequantd_device_info{"), HasSubstr("device=\"cpu\"")));
}

// The bundled model (scripts/make-model.sh), when DEQUANTD_MODEL_DIR points at it: ListTensors
// reports its 210 layers, and a layer dequantized by name equals DequantizeReference on the
// same checkpoint opened here.
TEST_F(ServiceTest, BundledModelListAndDequantizeByName) {
  const char* dir = std::getenv("DEQUANTD_MODEL_DIR");
  if (dir == nullptr || *dir == '\0') GTEST_SKIP() << "DEQUANTD_MODEL_DIR is not set";
  ServerOptions options;
  options.model_dir = dir;
  StartServer(options);
  EXPECT_EQ(server_->layer_count(), 210);

  grpc::ClientContext list_context;
  v1::ListTensorsResponse list;
  ASSERT_TRUE(stub_->ListTensors(&list_context, {}, &list).ok());
  EXPECT_EQ(list.model(), dir);
  ASSERT_EQ(list.tensors_size(), 210);
  const auto q_proj = std::find_if(list.tensors().begin(), list.tensors().end(), [](const auto& t) {
    return t.name() == "model.layers.0.self_attn.q_proj";
  });
  ASSERT_NE(q_proj, list.tensors().end());
  EXPECT_EQ(q_proj->in_features(), 576);
  EXPECT_EQ(q_proj->out_features(), 576);
  EXPECT_EQ(q_proj->group_size(), 64);
  EXPECT_EQ(q_proj->scale_dtype(), v1::DTYPE_FP16);
  // qweight 576 * 72 * 4 + qzeros 9 * 72 * 4 + scales 9 * 576 * 2.
  EXPECT_EQ(q_proj->packed_bytes(), 165888 + 2592 + 10368);
  EXPECT_FALSE(q_proj->resident_on_device());

  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const QuantizedLayer* layer = (*checkpoint)->Find("model.layers.0.mlp.down_proj");
  ASSERT_NE(layer, nullptr);
  std::vector<uint8_t> expected(static_cast<size_t>(layer->view.shape.output_bytes(DType::kBF16)));
  ASSERT_TRUE(
      DequantizeReference(layer->view, DType::kBF16, 0, layer->view.shape.K, expected.data()).ok());

  v1::DequantizeRequest request;
  request.set_tensor("model.layers.0.mlp.down_proj");
  request.set_output_dtype(v1::DTYPE_BF16);
  const Result result = Dequantize(request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.headers.size(), 1u);
  EXPECT_THAT(result.headers[0].shape(), ::testing::ElementsAre(1536, 576));
  EXPECT_EQ(result.bytes.size(), expected.size());
  EXPECT_TRUE(result.bytes == expected);
}

TEST_F(ServiceTest, MissingOrCorruptModelRefusesToStart) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.backend = "cpu";
  options.model_dir = ::testing::TempDir() + "/no-such-model-dir";
  absl::StatusOr<std::unique_ptr<DequantServer>> missing = DequantServer::Start(options);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);

  // A safetensors file whose header claims 1000 bytes of JSON but holds 5.
  std::string dir = ::testing::TempDir() + "/service_test_corrupt.XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  std::ofstream(dir + "/config.json")
      << R"({"quantization_config":{"quant_method":"awq","bits":4,"group_size":128,)"
      << R"("zero_point":true,"version":"gemm"}})";
  const char header_length[8] = {static_cast<char>(0xE8), 0x03, 0, 0, 0, 0, 0, 0};  // 1000
  std::ofstream(dir + "/model.safetensors", std::ios::binary)
      << std::string(header_length, 8) << "{bad";
  options.model_dir = dir;
  absl::StatusOr<std::unique_ptr<DequantServer>> corrupt = DequantServer::Start(options);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_THAT(corrupt.status().code(),
              ::testing::AnyOf(absl::StatusCode::kInvalidArgument, absl::StatusCode::kDataLoss));
  EXPECT_THAT(std::string(corrupt.status().message()), HasSubstr("model.safetensors"));
}

// Start with `options` on no model and the CPU backend (1 thread unless set).
absl::Status StartStatus(ServerOptions options) {
  options.backend = "cpu";
  absl::StatusOr<std::unique_ptr<DequantServer>> server = DequantServer::Start(options);
  return server.status();
}

TEST(ServerOptionsTest, ListenMustBeHostAndPortInRange) {
  for (const char* listen :
       {"127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1", "127.0.0.1:", ":50051", "::1:0", "[::1",
        "127.0.0.1:-1", "127.0.0.1:http", "127.0.0.1:000000"}) {
    ServerOptions options;
    options.listen = listen;
    options.metrics_listen = "";
    options.cpu_threads = 1;
    const absl::Status status = StartStatus(options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << listen;
    EXPECT_THAT(std::string(status.message()), HasSubstr("listen")) << listen;
  }
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "127.0.0.1:70000";
  options.cpu_threads = 1;
  const absl::Status status = StartStatus(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("metrics_listen"));
}

TEST(ServerOptionsTest, ListenAcceptsPortZeroAndBracketedIpv6) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.cpu_threads = 1;
  EXPECT_TRUE(StartStatus(options).ok()) << StartStatus(options);
  options.listen = "[::1]:0";  // no IPv6 on the host is UNAVAILABLE, not INVALID_ARGUMENT
  EXPECT_NE(StartStatus(options).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ServerOptionsTest, CpuThreadsIsBounded) {
  for (int threads : {-1, 1025, 100000}) {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "";
    options.cpu_threads = threads;
    const absl::Status status = StartStatus(options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << threads;
    EXPECT_THAT(std::string(status.message()), HasSubstr("cpu_threads")) << threads;
  }
}

TEST(ServerOptionsTest, GrpcReceiveLimitSaturatesAtIntMax) {
  // 256 MiB + 256 MiB / 16 + 1 MiB = 268435456 + 16777216 + 1048576.
  EXPECT_EQ(GrpcReceiveLimitBytes(int64_t{256} << 20), 286261248);
  EXPECT_EQ(GrpcReceiveLimitBytes(kMaxRequestBytesLimit), INT_MAX);
  EXPECT_EQ(GrpcReceiveLimitBytes(kMaxRequestBytesLimit + 1), INT_MAX);
  EXPECT_EQ(GrpcReceiveLimitBytes(int64_t{INT_MAX}), INT_MAX);
  EXPECT_EQ(GrpcReceiveLimitBytes(int64_t{INT_MAX} + 1), INT_MAX);
  // max + max / 16 would overflow int64: still INT_MAX, not a wrapped-around small limit.
  EXPECT_EQ(GrpcReceiveLimitBytes(std::numeric_limits<int64_t>::max()), INT_MAX);
}

TEST(ServerOptionsTest, MaxRequestBytesBeyondGrpcsLimitIsRefused) {
  for (int64_t bytes : {int64_t{0}, int64_t{-1}, kMaxRequestBytesLimit + 1, int64_t{INT_MAX},
                        std::numeric_limits<int64_t>::max()}) {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "";
    options.cpu_threads = 1;
    options.max_request_bytes = bytes;
    const absl::Status status = StartStatus(options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bytes;
    EXPECT_THAT(std::string(status.message()),
                AllOf(HasSubstr("max_request_bytes (--max-request-bytes) must be in "
                                "1..2020174185"),
                      HasSubstr("got " + std::to_string(bytes))))
        << bytes;
  }
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.cpu_threads = 1;
  options.max_request_bytes = kMaxRequestBytesLimit;  // the largest is served
  EXPECT_TRUE(StartStatus(options).ok()) << StartStatus(options);
}

TEST(ServerOptionsTest, ShutdownDeadlineMustBeANumberOfSecondsInRange) {
  const struct {
    double seconds;
    const char* shown;
  } kRefused[] = {{std::nan(""), "nan"},
                  {-1, "-1"},
                  {-0.5, "-0.5"},
                  {std::numeric_limits<double>::infinity(), "inf"},
                  {1e300, "1e+300"}};
  for (const auto& c : kRefused) {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "";
    options.cpu_threads = 1;
    options.shutdown_deadline_seconds = c.seconds;
    const absl::Status status = StartStatus(options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.shown;
    EXPECT_EQ(status.message(),
              std::string("shutdown_deadline (--shutdown-deadline) must be a number of seconds in "
                          "0..86400, got ") +
                  c.shown);
  }
  for (double seconds : {0.0, 86400.0}) {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "";
    options.cpu_threads = 1;
    options.shutdown_deadline_seconds = seconds;
    EXPECT_TRUE(StartStatus(options).ok()) << seconds;
  }
}

// A second server on a port in use is refused, and before its model loads (a large checkpoint
// takes minutes): an empty model directory, whose load would be NOT_FOUND ("no *.safetensors
// files"), is not reached.
TEST_F(ServiceTest, SecondServerOnAPortInUseIsRefusedBeforeItsModelLoads) {
  StartServer({});
  const std::string empty_model =
      ::testing::TempDir() + "/port-in-use-model-" + std::to_string(::getpid());
  ASSERT_TRUE(std::filesystem::create_directories(empty_model));
  for (const std::string& model_dir : {std::string(), empty_model}) {
    SCOPED_TRACE(model_dir);
    ServerOptions second;
    second.listen = "127.0.0.1:" + std::to_string(server_->port());
    second.metrics_listen = "";
    second.backend = "cpu";
    second.cpu_threads = 1;
    second.model_dir = model_dir;
    // Without SO_REUSEPORT off, gRPC would bind too and the two servers would split the traffic.
    absl::StatusOr<std::unique_ptr<DequantServer>> started = DequantServer::Start(second);
    ASSERT_FALSE(started.ok());
    EXPECT_EQ(started.status().code(), absl::StatusCode::kUnavailable) << started.status();
    EXPECT_EQ(started.status().message(),
              absl::StrCat("listen (--listen) \"", second.listen,
                           "\": cannot serve gRPC there: Address already in use"));
  }
}

TEST_F(ServiceTest, ShutdownIsIdempotentAndWaitReturns) {
  StartServer({}, /*with_metrics=*/true);
  server_->Shutdown(1.0);
  server_->Shutdown(1.0);
  server_->Wait();
  EXPECT_EQ(HttpGetMetrics(server_->metrics_port()), "");  // /metrics stopped
}

}  // namespace
}  // namespace dequantd
