// DequantClient and the dequantctl subcommands against a scripted in-process DequantService:
// malformed streams become DATA_LOSS through real gRPC, server errors keep their code, and the
// list/info/benchmark output is rendered from the protos.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "client/client.h"
#include "client/commands.h"
#include "client/shm_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/test_dir.h"

namespace dequantd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Answers Dequantize with `script` (then `final_status`), the other calls with canned protos.
class ScriptedService final : public v1::DequantService::Service {
 public:
  std::vector<v1::DequantizeResponse> script;
  grpc::Status final_status = grpc::Status::OK;
  std::atomic<int> delay_ms{0};  // before the first message
  v1::ListTensorsResponse list;
  grpc::Status list_status = grpc::Status::OK;  // ListTensors answers this when not OK
  v1::BenchmarkResponse benchmark;
  v1::BenchmarkRequest last_benchmark_request;
  v1::SharedMemoryStatusResponse regions;

  grpc::Status Dequantize(grpc::ServerContext*, const v1::DequantizeRequest*,
                          grpc::ServerWriter<v1::DequantizeResponse>* writer) override {
    return Play(*writer);
  }
  grpc::Status DequantizeLayers(grpc::ServerContext*, const v1::DequantizeLayersRequest*,
                                grpc::ServerWriter<v1::DequantizeResponse>* writer) override {
    return Play(*writer);
  }
  // Tests set `script` between calls; a handler whose client cancelled may still be running on a
  // gRPC thread then, so it plays a copy taken at its start (under the lock) and stops at the
  // first failed write.
  void SetScript(std::vector<v1::DequantizeResponse> s) {
    std::lock_guard<std::mutex> lock(mu_);
    script = std::move(s);
  }
  grpc::Status ListTensors(grpc::ServerContext*, const v1::ListTensorsRequest*,
                           v1::ListTensorsResponse* response) override {
    if (!list_status.ok()) return list_status;
    *response = list;
    return grpc::Status::OK;
  }
  grpc::Status GetServerInfo(grpc::ServerContext*, const v1::GetServerInfoRequest*,
                             v1::GetServerInfoResponse* response) override {
    response->set_version("9.9.9");
    response->set_backend("cuda");
    v1::DeviceInfo* d = response->add_devices();
    d->set_index(0);
    d->set_name("NVIDIA H200");
    d->set_compute_capability("9.0");
    d->set_memory_bytes(int64_t{141} << 30);
    d->set_driver_version("13.0");
    return grpc::Status::OK;
  }
  grpc::Status SharedMemoryStatus(grpc::ServerContext*, const v1::SharedMemoryStatusRequest*,
                                  v1::SharedMemoryStatusResponse* response) override {
    *response = regions;
    return grpc::Status::OK;
  }
  grpc::Status Benchmark(grpc::ServerContext*, const v1::BenchmarkRequest* request,
                         v1::BenchmarkResponse* response) override {
    last_benchmark_request = *request;
    *response = benchmark;
    return grpc::Status::OK;
  }

 private:
  grpc::Status Play(grpc::ServerWriter<v1::DequantizeResponse>& writer) {
    std::vector<v1::DequantizeResponse> copy;
    grpc::Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      copy = script;
      status = final_status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
    for (const v1::DequantizeResponse& r : copy) {
      if (!writer.Write(r)) break;
    }
    return status;
  }
  std::mutex mu_;
};

class FakeServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    client_ = *DequantClient::Connect("127.0.0.1:" + std::to_string(port));
  }
  void TearDown() override { server_->Shutdown(); }

  static v1::DequantizeResponse Header(int64_t K, int64_t N, int64_t total) {
    v1::DequantizeResponse r;
    r.mutable_header()->add_shape(K);
    r.mutable_header()->add_shape(N);
    r.mutable_header()->set_dtype(v1::DTYPE_FP16);
    r.mutable_header()->set_total_bytes(total);
    return r;
  }
  static v1::DequantizeResponse Chunk(int64_t offset, const std::string& data) {
    v1::DequantizeResponse r;
    r.set_offset(offset);
    r.set_data(data);
    return r;
  }
  static v1::DequantizeResponse LayerHeader(const std::string& tensor, int64_t K, int64_t N) {
    v1::DequantizeResponse r = Header(K, N, K * N * 2);
    r.mutable_header()->set_tensor(tensor);
    return r;
  }
  absl::StatusOr<std::vector<DequantizedTensor>> DequantizeLayers() {
    return client_->DequantizeLayersToMemory(v1::DequantizeLayersRequest());
  }
  absl::StatusOr<DequantizedTensor> Dequantize() {
    v1::DequantizeRequest request;
    request.set_tensor("x");
    return client_->DequantizeToMemory(request);
  }

  // A region call's reply: a header naming `region` (layer_headers for DequantizeLayers).
  static v1::DequantizeResponse RegionReply(const std::string& region, bool layers) {
    v1::DequantizeResponse r;
    v1::DequantizeHeader* h = layers ? r.add_layer_headers() : r.mutable_header();
    *h = LayerHeader("a", 1, 8).header();
    h->set_region(region);
    return r;
  }
  // Calls into region "r" through RegionClient (both busy-poll settings give the same results).
  absl::StatusOr<v1::DequantizeHeader> DequantizeInto(int64_t busy_poll_us = 10'000) {
    ClientOptions options;
    options.region_busy_poll_us = busy_poll_us;
    RegionClient regions(client_->channel(), options);
    v1::DequantizeRequest request;
    request.set_tensor("a");
    request.mutable_output_region()->set_name("r");
    return regions.DequantizeInto(request);
  }
  absl::StatusOr<std::vector<v1::DequantizeHeader>> DequantizeLayersInto() {
    RegionClient regions(client_->channel());
    v1::DequantizeLayersRequest request;
    request.add_tensors("a");
    request.mutable_output_region()->set_name("r");
    return regions.DequantizeLayersInto(request);
  }

  ScriptedService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<DequantClient> client_;
};

TEST_F(FakeServerTest, ARegionReplyIsOneHeaderNamingTheRegion) {
  for (int64_t busy_poll_us : {0, 10'000}) {
    service_.SetScript({RegionReply("r", /*layers=*/false)});
    absl::StatusOr<v1::DequantizeHeader> header = DequantizeInto(busy_poll_us);
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->region(), "r");
    EXPECT_EQ(header->total_bytes(), 16);
  }
  service_.SetScript({RegionReply("r", /*layers=*/true)});
  absl::StatusOr<std::vector<v1::DequantizeHeader>> headers = DequantizeLayersInto();
  ASSERT_TRUE(headers.ok()) << headers.status();
  ASSERT_EQ(headers->size(), 1u);
  EXPECT_EQ((*headers)[0].tensor(), "a");
}

TEST_F(FakeServerTest, ARegionReplyAfterTheBusyPollIsTakenByTheBlockingWait) {
  service_.delay_ms = 30;
  service_.SetScript({RegionReply("r", /*layers=*/false)});
  absl::StatusOr<v1::DequantizeHeader> header = DequantizeInto(/*busy_poll_us=*/1'000);
  service_.delay_ms = 0;
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->region(), "r");
}

TEST_F(FakeServerTest, MalformedRegionRepliesAreDataLoss) {
  for (const bool layers : {false, true}) {
    v1::DequantizeResponse with_data = RegionReply("r", layers);
    with_data.set_data("xx");
    const std::vector<std::pair<std::string, std::vector<v1::DequantizeResponse>>> cases = {
        {"no message", {}},
        {"several messages", {RegionReply("r", layers), RegionReply("r", layers)}},
        {"data bytes", {with_data}},
        {"names region", {RegionReply("elsewhere", layers)}},
        // The other method's reply: a Dequantize header for layers, layer_headers for one.
        {layers ? "and a header" : "expected a header", {RegionReply("r", !layers)}},
    };
    for (const auto& [message, script] : cases) {
      service_.SetScript(script);
      const absl::Status status =
          layers ? DequantizeLayersInto().status() : DequantizeInto().status();
      EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << message;
      EXPECT_THAT(status.message(), HasSubstr(message));
    }
  }
}

// DequantizeLayersIntoSummary (issue 23): a summary reply is returned as is once it names the
// region, offset and count asked for; a server that predates region_reply answers with headers,
// whose summary is worked out when they lie one after another from the offset.
TEST_F(FakeServerTest, ASummaryCallTakesASummaryOrTheHeadersOfAnOlderServer) {
  RegionClient regions(client_->channel());
  v1::DequantizeLayersRequest request;
  request.add_tensors("a");
  request.add_tensors("b");
  request.set_region_reply(v1::REGION_REPLY_SUMMARY);
  request.mutable_output_region()->set_name("r");
  request.mutable_output_region()->set_offset(32);
  v1::DequantizeResponse summary_reply;
  v1::RegionSummary* summary = summary_reply.mutable_region_summary();
  summary->set_layer_count(2);
  summary->set_total_bytes(48);
  summary->set_region("r");
  summary->set_region_offset(32);
  service_.SetScript({summary_reply});
  absl::StatusOr<v1::RegionSummary> got = regions.DequantizeLayersIntoSummary(request);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->layer_count(), 2);
  EXPECT_EQ(got->total_bytes(), 48);

  // An older server: two headers, 16 and 32 bytes, at 32 and 48.
  v1::DequantizeResponse headers;
  for (const auto& [name, n, at] : {std::tuple{"a", 1, 32}, std::tuple{"b", 2, 48}}) {
    v1::DequantizeHeader* h = headers.add_layer_headers();
    *h = LayerHeader(name, n, 8).header();
    h->set_region("r");
    h->set_region_offset(at);
  }
  service_.SetScript({headers});
  got = regions.DequantizeLayersIntoSummary(request);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->layer_count(), 2);
  EXPECT_EQ(got->total_bytes(), 16 + 32);
  EXPECT_EQ(got->region(), "r");
  EXPECT_EQ(got->region_offset(), 32);

  // Headers not placed one after another, and summaries of another region, offset or count.
  headers.mutable_layer_headers(1)->set_region_offset(64);
  v1::DequantizeResponse other_region = summary_reply, other_offset = summary_reply,
                         other_count = summary_reply;
  other_region.mutable_region_summary()->set_region("elsewhere");
  other_offset.mutable_region_summary()->set_region_offset(0);
  other_count.mutable_region_summary()->set_layer_count(3);
  for (const v1::DequantizeResponse& bad : {headers, other_region, other_offset, other_count}) {
    service_.SetScript({bad});
    const absl::Status status = regions.DequantizeLayersIntoSummary(request).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  }
}

TEST_F(FakeServerTest, ARegionCallKeepsTheServersErrorCode) {
  service_.SetScript({});
  service_.final_status =
      grpc::Status(grpc::StatusCode::NOT_FOUND, "region \"r\" is not registered");
  absl::StatusOr<v1::DequantizeHeader> header = DequantizeInto();
  EXPECT_EQ(header.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(header.status().message(), HasSubstr("not registered"));
}

TEST_F(FakeServerTest, ReassemblesContiguousChunks) {
  service_.SetScript({Header(1, 8, 16), Chunk(0, "0123456789"), Chunk(10, "abcdef")});
  absl::StatusOr<DequantizedTensor> r = Dequantize();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(std::string(r->data.begin(), r->data.end()), "0123456789abcdef");
}

TEST_F(FakeServerTest, LayersReassembleEachLayerFromOffsetZero) {
  service_.SetScript({LayerHeader("a", 1, 8), Chunk(0, "0123456789"), Chunk(10, "abcdef"),
                      LayerHeader("b", 1, 8), Chunk(0, "ABCDEFGHIJKLMNOP")});
  absl::StatusOr<std::vector<DequantizedTensor>> r = DequantizeLayers();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].header.tensor(), "a");
  EXPECT_EQ(std::string((*r)[0].data.begin(), (*r)[0].data.end()), "0123456789abcdef");
  EXPECT_EQ((*r)[1].header.tensor(), "b");
  EXPECT_EQ(std::string((*r)[1].data.begin(), (*r)[1].data.end()), "ABCDEFGHIJKLMNOP");

  service_.SetScript({});  // no layers at all (an empty model)
  r = DequantizeLayers();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->empty());
}

TEST_F(FakeServerTest, MalformedLayerStreamsAreDataLoss) {
  // Layer "a" cut short by the next header.
  service_.SetScript({LayerHeader("a", 1, 8), Chunk(0, "01234567"), LayerHeader("b", 1, 8),
                      Chunk(0, "ABCDEFGHIJKLMNOP")});
  absl::StatusOr<std::vector<DequantizedTensor>> r = DequantizeLayers();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("\"a\""));
  // The last layer ending short; a header without tensor; chunks before any header.
  service_.SetScript({LayerHeader("a", 1, 8), Chunk(0, "01234567")});
  EXPECT_EQ(DequantizeLayers().status().code(), absl::StatusCode::kDataLoss);
  service_.SetScript({Header(1, 8, 16), Chunk(0, "0123456789abcdef")});
  EXPECT_EQ(DequantizeLayers().status().code(), absl::StatusCode::kDataLoss);
  service_.SetScript({Chunk(0, "0123456789abcdef")});
  EXPECT_EQ(DequantizeLayers().status().code(), absl::StatusCode::kDataLoss);
  // Offsets restart at 0 per layer: continuing layer a's offsets is a gap.
  service_.SetScript({LayerHeader("a", 1, 8), Chunk(0, "0123456789abcdef"), LayerHeader("b", 1, 8),
                      Chunk(16, "ABCDEFGHIJKLMNOP")});
  EXPECT_EQ(DequantizeLayers().status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(FakeServerTest, GapInOffsetsIsDataLoss) {
  service_.SetScript({Header(1, 8, 16), Chunk(0, "01234567"), Chunk(9, "abcdefg")});
  EXPECT_EQ(Dequantize().status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(FakeServerTest, StreamEndingShortIsDataLoss) {
  service_.SetScript({Header(1, 8, 16), Chunk(0, "01234567")});
  absl::Status s = Dequantize().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("8 of 16 bytes"));
}

TEST_F(FakeServerTest, MissingHeaderIsDataLoss) {
  service_.SetScript({Chunk(0, "01234567")});
  EXPECT_EQ(Dequantize().status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(FakeServerTest, ServerErrorMidStreamKeepsItsCode) {
  service_.SetScript({Header(1, 8, 16), Chunk(0, "01234567")});
  service_.final_status = grpc::Status(grpc::StatusCode::INTERNAL, "device lost");
  EXPECT_EQ(Dequantize().status(), absl::InternalError("device lost"));
}

TEST_F(FakeServerTest, ListRendersTable) {
  v1::QuantizedTensorInfo* t = service_.list.add_tensors();
  t->set_name("model.layers.0.mlp.up_proj");
  t->set_in_features(576);
  t->set_out_features(1536);
  t->set_group_size(64);
  t->set_scale_dtype(v1::DTYPE_FP16);
  t->set_packed_bytes(3 << 19);  // 1.5 MiB
  t->set_resident_on_device(true);
  t->set_format("gptq");
  service_.list.set_model("/models/m");
  std::ostringstream out;
  ASSERT_TRUE(RunList(*client_, out).ok());
  EXPECT_EQ(
      out.str(),
      "name                        format    K     N  group_size  scale dtype   MiB  resident\n"
      "model.layers.0.mlp.up_proj  gptq    576  1536          64  fp16         1.50  gpu\n"
      "1 tensor, 1.50 MiB packed, model '/models/m'\n");
}

// A model with stacked experts (mxfp4) gets an "E" column; 0 (an older server) reads as 1, and
// an empty format (a server before issue 21: AWQ only) as awq_gemm.
TEST_F(FakeServerTest, ListRendersExpertsColumnForStackedLayers) {
  v1::QuantizedTensorInfo* t = service_.list.add_tensors();
  t->set_name("experts.down_proj");
  t->set_in_features(2880);
  t->set_out_features(2880);
  t->set_group_size(32);
  t->set_scale_dtype(v1::DTYPE_UINT8);
  t->set_packed_bytes(1 << 20);
  t->set_experts(32);
  t->set_format("mxfp4");
  v1::QuantizedTensorInfo* dense = service_.list.add_tensors();
  dense->set_name("q_proj");
  dense->set_in_features(64);
  dense->set_out_features(64);
  dense->set_group_size(64);
  dense->set_scale_dtype(v1::DTYPE_FP16);
  dense->set_packed_bytes(1 << 20);
  service_.list.set_model("/models/gpt-oss");
  std::ostringstream out;
  ASSERT_TRUE(RunList(*client_, out).ok());
  EXPECT_EQ(out.str(),
            "name               format     E     K     N  group_size  scale dtype   MiB  resident\n"
            "experts.down_proj  mxfp4     32  2880  2880          32  uint8        1.00  host\n"
            "q_proj             awq_gemm   1    64    64          64  fp16         1.00  host\n"
            "2 tensors, 2.00 MiB packed, model '/models/gpt-oss'\n");
}

TEST_F(FakeServerTest, InfoListsDevices) {
  std::ostringstream out;
  ASSERT_TRUE(RunInfo(*client_, out).ok());
  EXPECT_THAT(out.str(), HasSubstr("backend:      cuda\n"));
  EXPECT_THAT(out.str(),
              HasSubstr("[0] NVIDIA H200, compute capability 9.0, 141.0 GiB, driver 13.0"));
}

// info's formats line: ListTensors' layers grouped by format and expert count, in list order.
TEST_F(FakeServerTest, InfoSummarizesTheLayersFormats) {
  const auto add = [this](const char* name, const char* format, int64_t experts) {
    v1::QuantizedTensorInfo* t = service_.list.add_tensors();
    t->set_name(name);
    t->set_format(format);
    t->set_experts(experts);
  };
  add("a.experts.down_proj", "mxfp4", 32);
  add("a.experts.gate_up_proj", "mxfp4", 32);
  add("b.experts.down_proj", "mxfp4", 4);
  add("lm_head", "", 0);  // an older server: AWQ, one matrix
  std::ostringstream out;
  ASSERT_TRUE(RunInfo(*client_, out).ok());
  EXPECT_THAT(out.str(), HasSubstr("\nformats:      mxfp4 (2 layers, 32 experts each), mxfp4 (1 "
                                   "layer, 4 experts each), awq_gemm (1 layer)\ncpu threads:"));
}

// ListTensors failing (here RESOURCE_EXHAUSTED, as a list over the receive limit would) costs
// only the formats line: the server's other facts are still printed and the command succeeds.
TEST_F(FakeServerTest, InfoSaysWhyTheFormatsAreUnknownWhenListTensorsFails) {
  service_.list_status =
      grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "Received message larger than max");
  std::ostringstream out;
  ASSERT_TRUE(RunInfo(*client_, out).ok());
  EXPECT_THAT(out.str(), HasSubstr("\nformats:      unknown (ListTensors failed: "
                                   "RESOURCE_EXHAUSTED: Received message larger than max)\n"));
  EXPECT_THAT(out.str(), HasSubstr("backend:      cuda\n"));
  EXPECT_THAT(out.str(), HasSubstr("[0] NVIDIA H200, compute capability 9.0"));
}

TEST_F(FakeServerTest, InfoWithoutLayersSaysSo) {
  std::ostringstream out;
  ASSERT_TRUE(RunInfo(*client_, out).ok());
  EXPECT_THAT(out.str(), HasSubstr("\nformats:      none (no quantized layers)\n"));
}

TEST_F(FakeServerTest, RegionsRendersTable) {
  v1::SharedMemoryRegionInfo* host = service_.regions.add_regions();
  host->set_name("a");
  host->set_kind("host");
  host->set_key("/dequantctl.7.a");
  host->set_device_id(-1);
  host->set_byte_size(1 << 20);
  host->set_pinned(true);
  host->set_owner("ipv4:127.0.0.1:41234");
  host->set_calls_in_flight(1);
  host->set_idle_seconds(2.5);
  v1::SharedMemoryRegionInfo* device = service_.regions.add_regions();
  device->set_name("b");
  device->set_kind("device");
  device->set_device_id(0);
  device->set_offset(4096);
  device->set_byte_size(2048);
  device->set_owner("unix:");
  device->set_idle_seconds(10);
  service_.regions.set_mode("all");
  service_.regions.set_max_regions(16);
  service_.regions.set_max_bytes(int64_t{1} << 30);
  service_.regions.set_idle_release_seconds(300);
  std::ostringstream out;
  ASSERT_TRUE(RunRegions(*client_, out).ok());
  EXPECT_EQ(out.str(),
            "name  kind    key              device  offset    bytes  pinned  calls  idle s  owner\n"
            "a     host    /dequantctl.7.a       -       0  1048576  yes         1     2.5  "
            "ipv4:127.0.0.1:41234\n"
            "b     device  -                     0    4096     2048  -           0    10.0  unix:\n"
            "2 regions, 1050624 of 1073741824 bytes (at most 16 regions); --shared-memory=all, "
            "idle regions released after 300 s\n");

  service_.regions = v1::SharedMemoryStatusResponse();
  service_.regions.set_mode("off");
  service_.regions.set_max_regions(1);
  out.str("");
  ASSERT_TRUE(RunRegions(*client_, out).ok());
  EXPECT_EQ(out.str(),
            "name  kind  key  device  offset  bytes  pinned  calls  idle s  owner\n"
            "0 regions, 0 of 0 bytes (at most 1 region); --shared-memory=off, idle regions "
            "released never\n");
}

TEST_F(FakeServerTest, BenchmarkSendsRequestAndRendersRows) {
  service_.benchmark.set_device("NVIDIA H200");
  service_.benchmark.set_peak_copy_bytes_per_second(4.1e12);
  v1::BenchmarkRow* row = service_.benchmark.add_rows();
  row->set_variant("v2");
  row->set_in_features(4096);
  row->set_out_features(4096);
  row->set_group_size(128);
  row->set_output_dtype(v1::DTYPE_FP16);
  row->set_bytes_moved(42205184);
  row->set_median_seconds(12.5e-6);
  row->set_mean_seconds(20e-6);
  row->set_bytes_per_second(3.3764e12);
  row->set_fraction_of_peak(0.8235);
  row->set_correct(true);
  row->set_divergent(true);
  row->set_launch_config("block=256");
  BenchmarkOptions options;
  options.shapes = "4096x4096";
  absl::StatusOr<v1::BenchmarkRequest> request = MakeBenchmarkRequest(options);
  ASSERT_TRUE(request.ok());
  std::ostringstream out;
  ASSERT_TRUE(RunBenchmark(*client_, *request, out).ok());
  ASSERT_EQ(service_.last_benchmark_request.shapes_size(), 1);
  EXPECT_EQ(service_.last_benchmark_request.shapes(0).in_features(), 4096);
  EXPECT_THAT(out.str(), HasSubstr("device: NVIDIA H200, peak copy 4100.0 GB/s"));
  EXPECT_THAT(out.str(), HasSubstr("v2"));
  EXPECT_THAT(out.str(), HasSubstr("42.21"));   // MB moved
  EXPECT_THAT(out.str(), HasSubstr("12.5*"));   // median us, divergent
  EXPECT_THAT(out.str(), HasSubstr("3376.4"));  // GB/s
  EXPECT_THAT(out.str(), HasSubstr("82.3"));    // % of peak
  EXPECT_THAT(out.str(), HasSubstr("block=256"));
  EXPECT_THAT(out.str(), HasSubstr("* median and mean differ by more than 15%"));

  // No divergent row: no star, no footnote.
  service_.benchmark.mutable_rows(0)->set_divergent(false);
  std::ostringstream calm;
  ASSERT_TRUE(RunBenchmark(*client_, *request, calm).ok());
  EXPECT_THAT(calm.str(), HasSubstr("12.5"));
  EXPECT_THAT(calm.str(), Not(HasSubstr("12.5*")));
  EXPECT_THAT(calm.str(), Not(HasSubstr("differ by more than 15%")));
}

TEST_F(FakeServerTest, DequantizeLayersCreatesTheOutDir) {
  service_.SetScript({LayerHeader("m.a", 1, 8), Chunk(0, std::string(16, 'x'))});
  DequantizeLayersOptions options;
  options.out_dir = client_test::TempPath("layers_out") + "/new/nested";
  std::ostringstream out;
  absl::Status status = RunDequantizeLayers(*client_, options, out);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(std::filesystem::is_regular_file(options.out_dir + "/m.a.npy"));

  // A file where a directory must be.
  const std::string file = client_test::TempPath("layers_out_file");
  std::ofstream(file) << "x";
  options.out_dir = file + "/sub";
  status = RunDequantizeLayers(*client_, options, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("--out-dir"));
}

// On a terminal, dequantize-layers lists the layers for the total (2 layers of 1 x 8 fp16: 32
// bytes) and draws the line as bytes arrive; a clock that moves 1 s per reading makes the times.
TEST_F(FakeServerTest, DequantizeLayersDrawsAProgressLineOnATerminal) {
  for (const char* name : {"m.a", "m.b"}) {
    v1::QuantizedTensorInfo* t = service_.list.add_tensors();
    t->set_name(name);
    t->set_in_features(1);
    t->set_out_features(8);
  }
  service_.SetScript({LayerHeader("m.a", 1, 8), Chunk(0, std::string(16, 'x')),
                      LayerHeader("m.b", 1, 8), Chunk(0, std::string(16, 'y'))});
  std::string terminal;
  auto now = std::chrono::steady_clock::time_point();
  DequantizeLayersOptions options;
  options.progress.terminal = true;
  options.progress.columns = 60;  // a bar of 10 cells
  options.progress.write = [&](absl::string_view text) { absl::StrAppend(&terminal, text); };
  options.progress.now = [&] { return now += std::chrono::seconds(1); };
  std::ostringstream out;
  const absl::Status status = RunDequantizeLayers(*client_, options, out);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(terminal,
            "\r2 layers:  50%|\u2588\u2588\u2588\u2588\u2588     | 16.0/32.0 [00:01<00:01, "
            "16.0B/s]"
            "\r2 layers: 100%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588| "
            "32.0/32.0 [00:03<00:00, 10.7B/s]"
            "\r2 layers: 100%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588| "
            "32.0/32.0 [00:04<00:00, 8.00B/s]\n");
  EXPECT_THAT(out.str(), HasSubstr("2 layers, fp16, 32 bytes in "));

  // Not a terminal: nothing.
  terminal.clear();
  options.progress.terminal = false;
  ASSERT_TRUE(RunDequantizeLayers(*client_, options, out).ok());
  EXPECT_EQ(terminal, "");
}

// On a terminal, dequantize draws a line for a result of kProgressMinBytes (64 MiB) and more,
// and none for a smaller one. The clock reads 32 s after the start from the first bytes on, so
// the final line's time and rate are known however the transport cuts the messages.
TEST_F(FakeServerTest, DequantizeDrawsAProgressLineFromSixtyFourMiB) {
  std::string terminal;
  int readings = 0;
  DequantizeOptions options;
  options.tensor = "x";  // not in ListTensors: one stream, the size from the header
  options.progress.terminal = true;
  options.progress.columns = 60;  // a bar of 14 cells
  options.progress.write = [&](absl::string_view text) { absl::StrAppend(&terminal, text); };
  options.progress.now = [&] {
    return std::chrono::steady_clock::time_point() + std::chrono::seconds(readings++ == 0 ? 0 : 32);
  };

  std::vector<v1::DequantizeResponse> script = {Header(4096, 8192, kProgressMinBytes)};
  const std::string chunk(4 << 20, 'x');
  for (int64_t offset = 0; offset < kProgressMinBytes; offset += 4 << 20) {
    script.push_back(Chunk(offset, chunk));
  }
  service_.SetScript(std::move(script));
  std::ostringstream out;
  absl::Status status = RunDequantize(*client_, options, out);
  ASSERT_TRUE(status.ok()) << status;
  const size_t last = terminal.rfind('\r');
  ASSERT_NE(last, std::string::npos) << "no line drawn";
  EXPECT_EQ(terminal.substr(last),
            "\rx: 100%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588"
            "\u2588\u2588\u2588| 64.0M/64.0M [00:32<00:00, 2.00MB/s]\n");

  // One fp16 element less than 64 MiB, (1, 32 Mi - 1): no line.
  terminal.clear();
  readings = 0;
  const int64_t smaller = kProgressMinBytes - 2;
  script = {Header(1, smaller / 2, smaller)};
  for (int64_t offset = 0; offset < smaller; offset += 4 << 20) {
    script.push_back(Chunk(offset, chunk.substr(0, std::min<int64_t>(4 << 20, smaller - offset))));
  }
  service_.SetScript(std::move(script));
  status = RunDequantize(*client_, options, out);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(terminal, "");
}

// "a/b" and "a_b" both become DIR/a_b.npy: refused before any call, naming both; nothing written.
TEST_F(FakeServerTest, DequantizeLayersRefusesTwoLayersThatShareAnOutDirFile) {
  for (const char* name : {"m.x", "a/b", "a_b"}) {
    v1::QuantizedTensorInfo* t = service_.list.add_tensors();
    t->set_name(name);
    t->set_in_features(1);
    t->set_out_features(8);
  }
  service_.SetScript({LayerHeader("m.x", 1, 8), Chunk(0, std::string(16, 'x'))});
  DequantizeLayersOptions options;
  options.out_dir = client_test::TempPath("layers_clash");
  std::ostringstream out;
  absl::Status status = RunDequantizeLayers(*client_, options, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      status.message(),
      absl::StrCat("--out-dir: layers 'a/b' and 'a_b' would both be written to ", options.out_dir,
                   "/a_b.npy (a '/' in a layer name becomes '_'); fetch them apart with "
                   "--tensors, or write one file with --out"));
  EXPECT_FALSE(std::filesystem::exists(options.out_dir));
  // Either one alone is fine.
  options.tensors = "m.x";
  status = RunDequantizeLayers(*client_, options, out);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(std::filesystem::is_regular_file(options.out_dir + "/m.x.npy"));
}

TEST_F(FakeServerTest, DequantizeLayersFailingBeforeAnyResultCreatesNoOutDir) {
  service_.SetScript({});
  service_.final_status = grpc::Status(grpc::StatusCode::NOT_FOUND, "no tensor 'm.z'");
  DequantizeLayersOptions options;
  options.out_dir = client_test::TempPath("layers_never") + "/new";
  std::ostringstream out;
  const absl::Status status = RunDequantizeLayers(*client_, options, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(options.out_dir));
  EXPECT_EQ(out.str(), "");
}

}  // namespace
}  // namespace dequantd
