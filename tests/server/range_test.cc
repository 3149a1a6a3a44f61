// Byte ranges of a result (DequantizeRequest.offset/length), the hand-encoded response messages,
// and the stream limits: RequestedRange's exact errors; EncodeChunkMessage parses back to the
// same DequantizeResponse; the CPU backend's ranged output equals the reference's bytes for
// ranges at the start, the end, the middle and across row boundaries, computing only the covering
// rows; and through a real server (CPU backend, in-process): ranged streams, INVALID_ARGUMENT
// naming the field, max_concurrent_streams (RESOURCE_EXHAUSTED past it), a Unix socket listener
// and its file mode, cancellation in the middle of a range.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "dequant/v1/dequant.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend/backend.h"
#include "server/rpc/grpc_result_sink.h"
#include "server/rpc/request.h"
#include "server/server.h"
#include "tests/server/cpu_test_server.h"
#include "tests/server/test_layer.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;
using ::dequantd::testing::RandomPackedLayer;
using ::dequantd::testing::ReferenceBytes;
using ::dequantd::testing::ToInline;
using ::testing::HasSubstr;

// ---- RequestedRange -------------------------------------------------------------------------

TEST(RequestedRangeTest, ZeroZeroIsTheWholeResultAndZeroLengthRunsToTheEnd) {
  absl::StatusOr<ResultRange> all = RequestedRange(0, 0, 4096, 2);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->offset, 0);
  EXPECT_EQ(all->length, 4096);
  absl::StatusOr<ResultRange> tail = RequestedRange(1000, 0, 4096, 2);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(tail->offset, 1000);
  EXPECT_EQ(tail->length, 3096);
  absl::StatusOr<ResultRange> last = RequestedRange(4092, 4, 4096, 4);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->length, 4);
}

TEST(RequestedRangeTest, BadRangesAreInvalidArgumentNamingTheField) {
  struct Case {
    int64_t offset, length, element;
    const char* field;
  };
  for (const Case& c :
       {Case{-2, 0, 2, "offset"}, Case{0, -4, 2, "length"}, Case{3, 0, 2, "offset"},
        Case{0, 6, 4, "length"}, Case{4096, 0, 2, "offset"}, Case{5000, 2, 2, "offset"},
        Case{4094, 4, 2, "length"}, Case{0, 4098, 2, "length"}}) {
    absl::StatusOr<ResultRange> range = RequestedRange(c.offset, c.length, 4096, c.element);
    ASSERT_FALSE(range.ok()) << c.offset << "+" << c.length;
    EXPECT_EQ(range.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(range.status().message()), ::testing::StartsWith(c.field))
        << range.status();
  }
}

// ---- EncodeChunkMessage ---------------------------------------------------------------------

TEST(EncodeChunkMessageTest, ParsesBackToTheSameResponse) {
  std::vector<uint8_t> data(300000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
  for (int64_t offset :
       {int64_t{0}, int64_t{1}, int64_t{127}, int64_t{128}, (int64_t{1} << 40) + 5}) {
    for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, data.size()}) {
      grpc::ByteBuffer buffer = EncodeChunkMessage(offset, absl::MakeConstSpan(data.data(), size));
      v1::DequantizeResponse parsed;
      ASSERT_TRUE(
          grpc::SerializationTraits<v1::DequantizeResponse>::Deserialize(&buffer, &parsed).ok());
      EXPECT_FALSE(parsed.has_header());
      EXPECT_EQ(parsed.offset(), offset);
      ASSERT_EQ(parsed.data().size(), size);
      EXPECT_TRUE(std::equal(data.begin(), data.begin() + size, parsed.data().begin(),
                             [](uint8_t a, char b) { return a == static_cast<uint8_t>(b); }));
    }
  }
}

// ---- CPU backend ----------------------------------------------------------------------------

// Records a ranged call: checks the chunks are consecutive from the range's start.
class RangeSink final : public ChunkSink {
 public:
  explicit RangeSink(Range range) : range_(range) {}
  Range range() const override { return range_; }
  absl::Status Begin(const std::string&) override { return absl::OkStatus(); }
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> data) override {
    if (offset != range_.offset + static_cast<int64_t>(bytes.size())) gaps = true;
    bytes.insert(bytes.end(), data.begin(), data.end());
    ++chunks;
    return absl::OkStatus();
  }
  std::vector<uint8_t> bytes;
  bool gaps = false;
  int chunks = 0;

 private:
  Range range_;
};

struct RangeCase {
  int64_t offset;
  int64_t length;  // -1: to the end
};

TEST(CpuBackendRangeTest, RangesEqualTheReferenceBytesK320N1024G64Bf16ScalesToFp32) {
  const QuantShape shape{.K = 320, .N = 1024, .group_size = 64, .scale_dtype = DType::kBF16};
  const testing::PackedLayer layer = RandomPackedLayer(shape, 17);
  const std::vector<uint8_t> reference = ReferenceBytes(layer, DType::kF32);
  const int64_t total = static_cast<int64_t>(reference.size());  // 1310720; a row is 4096 bytes
  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  DequantSource source;
  source.host = layer.view();
  for (const RangeCase& c : {RangeCase{0, 4}, RangeCase{0, 70000}, RangeCase{total - 4, -1},
                             RangeCase{total - 5000, -1}, RangeCase{4096 * 7 + 12, 4096 * 100 + 8},
                             RangeCase{123456, 4}, RangeCase{0, -1}, RangeCase{4096 * 299, 4096}}) {
    const int64_t length = c.length < 0 ? total - c.offset : c.length;
    RangeSink sink(ChunkSink::Range{.offset = c.offset, .length = c.length});
    const absl::Status status = backend->Dequantize(source, DType::kF32, 65536, sink);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_FALSE(sink.gaps) << c.offset;
    ASSERT_EQ(static_cast<int64_t>(sink.bytes.size()), length) << c.offset;
    EXPECT_TRUE(std::equal(sink.bytes.begin(), sink.bytes.end(), reference.begin() + c.offset))
        << "range at " << c.offset << " of " << length << " bytes";
    EXPECT_EQ(sink.chunks, (length + 65535) / 65536) << c.offset;
  }
}

// ---- through a server -----------------------------------------------------------------------

struct Streamed {
  grpc::Status status;
  int headers = 0;
  int64_t header_total = 0;
  int64_t first_offset = -1;
  bool consecutive = true;
  std::vector<uint8_t> bytes;
};

class RangeServiceTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options) {
    absl::StatusOr<testing::CpuTestServer> started = testing::StartCpuTestServer(options);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(started->server);
    stub_ = std::move(started->stub);
  }

  Streamed Fetch(const v1::DequantizeRequest& request) {
    Streamed result;
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> reader =
        stub_->Dequantize(&context, request);
    v1::DequantizeResponse response;
    while (reader->Read(&response)) {
      if (response.has_header()) {
        ++result.headers;
        result.header_total = response.header().total_bytes();
      }
      if (response.data().empty()) continue;
      if (result.first_offset < 0) result.first_offset = response.offset();
      if (response.offset() != result.first_offset + static_cast<int64_t>(result.bytes.size())) {
        result.consecutive = false;
      }
      result.bytes.insert(result.bytes.end(), response.data().begin(), response.data().end());
    }
    result.status = reader->Finish();
    return result;
  }

  std::unique_ptr<DequantServer> server_;
  std::unique_ptr<v1::DequantService::Stub> stub_;
};

const QuantShape kShape{.K = 256, .N = 512, .group_size = 128, .scale_dtype = DType::kF16};

TEST_F(RangeServiceTest, RangesStreamHeaderThenTheReferenceBytesK256N512G128Fp16) {
  Start({});
  const testing::PackedLayer layer = RandomPackedLayer(kShape, 5);
  const std::vector<uint8_t> reference = ReferenceBytes(layer, DType::kF16);
  const int64_t total = static_cast<int64_t>(reference.size());  // 262144
  v1::DequantizeRequest request;
  *request.mutable_packed() = ToInline(layer, 128);
  request.set_chunk_bytes(64 << 10);
  struct Case {
    int64_t offset, length;
  };
  for (const Case& c : {Case{0, 0}, Case{0, 2}, Case{total - 2, 0}, Case{1022, 70002},
                        Case{100000, 0}, Case{total - 65538, 65538}}) {
    request.set_offset(c.offset);
    request.set_length(c.length);
    const Streamed s = Fetch(request);
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.headers, 1);
    EXPECT_EQ(s.header_total, total);  // the whole result's size, also for a range
    EXPECT_EQ(s.first_offset, c.offset);
    EXPECT_TRUE(s.consecutive);
    const int64_t length = c.length == 0 ? total - c.offset : c.length;
    ASSERT_EQ(static_cast<int64_t>(s.bytes.size()), length);
    EXPECT_TRUE(std::equal(s.bytes.begin(), s.bytes.end(), reference.begin() + c.offset))
        << c.offset << "+" << c.length;
  }
}

TEST_F(RangeServiceTest, BadRangesAreInvalidArgumentNamingTheFieldAndTheServerKeepsServing) {
  Start({});
  const testing::PackedLayer layer = RandomPackedLayer(kShape, 6);
  const int64_t total = kShape.output_bytes(DType::kF32);
  v1::DequantizeRequest request;
  *request.mutable_packed() = ToInline(layer, 128);
  request.set_output_dtype(v1::DTYPE_FP32);
  struct Case {
    int64_t offset, length;
    const char* message;
  };
  for (const Case& c :
       {Case{-4, 0, "offset must be >= 0"}, Case{0, -4, "length must be >= 0"},
        Case{2, 0, "offset 2 is not a multiple of the output dtype's size (4"},
        Case{0, 6, "length 6 is not a multiple"}, Case{total, 0, "is not inside the result"},
        Case{total - 4, 8, "runs past the result's end"}}) {
    request.set_offset(c.offset);
    request.set_length(c.length);
    const Streamed s = Fetch(request);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_THAT(s.status.error_message(), HasSubstr(c.message));
    EXPECT_EQ(s.headers, 0);
  }
  request.set_offset(total - 4);
  request.set_length(4);
  const Streamed last = Fetch(request);
  ASSERT_TRUE(last.status.ok()) << last.status.error_message();
  const std::vector<uint8_t> reference = ReferenceBytes(layer, DType::kF32);
  EXPECT_EQ(last.bytes, std::vector<uint8_t>(reference.end() - 4, reference.end()));
}

// A result big enough that a client which stops reading leaves the server blocked in a write
// (gRPC's flow-control window is a few MiB): 2048 x 4096 fp32 = 32 MiB.
const QuantShape kBigShape{.K = 2048, .N = 4096, .group_size = 128, .scale_dtype = DType::kF16};

TEST_F(RangeServiceTest, StreamsPastMaxConcurrentStreamsAreResourceExhausted) {
  ServerOptions options;
  options.max_concurrent_streams = 1;
  Start(options);
  const testing::PackedLayer layer = RandomPackedLayer(kBigShape, 7);
  v1::DequantizeRequest request;
  *request.mutable_packed() = ToInline(layer, 128);
  request.set_output_dtype(v1::DTYPE_FP32);
  // A stalled stream: one message read, then nothing.
  grpc::ClientContext stalled;
  std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> reader =
      stub_->Dequantize(&stalled, request);
  v1::DequantizeResponse first;
  ASSERT_TRUE(reader->Read(&first));
  ASSERT_TRUE(first.has_header());
  request.set_length(1024);
  const Streamed refused = Fetch(request);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("max_concurrent_streams = 1"));
  v1::DequantizeLayersRequest layers;
  grpc::ClientContext layers_context;
  std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> layers_reader =
      stub_->DequantizeLayers(&layers_context, layers);
  v1::DequantizeResponse ignored;
  while (layers_reader->Read(&ignored)) {
  }
  EXPECT_EQ(layers_reader->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Cancelling the stalled stream frees its slot (the handler returns at its next write).
  stalled.TryCancel();
  while (reader->Read(&first)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  Streamed again;
  for (int i = 0; i < 100; ++i) {
    again = Fetch(request);
    if (again.status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.bytes.size(), 1024u);
}

TEST_F(RangeServiceTest, CancellingInTheMiddleOfARangeEndsTheCallAndTheServerKeepsServing) {
  Start({});
  const testing::PackedLayer layer = RandomPackedLayer(kBigShape, 8);
  v1::DequantizeRequest request;
  *request.mutable_packed() = ToInline(layer, 128);
  request.set_output_dtype(v1::DTYPE_FP32);
  request.set_offset(4 << 20);
  request.set_length(16 << 20);
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> reader =
      stub_->Dequantize(&context, request);
  v1::DequantizeResponse response;
  ASSERT_TRUE(reader->Read(&response));  // header
  ASSERT_TRUE(reader->Read(&response));  // first chunk
  EXPECT_EQ(response.offset(), 4 << 20);
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  request.set_offset(0);
  request.set_length(4096);
  const Streamed s = Fetch(request);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.bytes.size(), 4096u);
}

TEST_F(RangeServiceTest, ListensOnAUnixSocketWhoseModeIsTheUmasksAndServesRanges) {
  const std::string dir = ::testing::TempDir() + "/dequantd_unix_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/dequantd.sock";
  const mode_t umask_now = ::umask(0);
  ::umask(umask_now);
  ServerOptions options;
  options.listen = "unix:" + path;
  Start(options);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0777 & ~umask_now);
  const testing::PackedLayer layer = RandomPackedLayer(kShape, 9);
  v1::DequantizeRequest request;
  *request.mutable_packed() = ToInline(layer, 128);
  request.set_offset(512);
  request.set_length(1024);
  const Streamed s = Fetch(request);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  const std::vector<uint8_t> reference = ReferenceBytes(layer, DType::kF16);
  EXPECT_EQ(s.bytes, std::vector<uint8_t>(reference.begin() + 512, reference.begin() + 1536));
  // A second server on the live socket is refused; the first keeps its clients.
  absl::StatusOr<testing::CpuTestServer> second = testing::StartCpuTestServer(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message(),
            "listen (--listen) \"unix:" + path + "\": cannot serve gRPC there: " + path +
                " is in use by a running server (a connection to it succeeded)");
  EXPECT_TRUE(Fetch(request).status.ok());
  server_.reset();
  std::filesystem::remove_all(dir);
}

TEST(RangeServerOptionsTest, BadUnixListenAndStreamLimitAreInvalidArgumentNamingTheOption) {
  ServerOptions options;
  options.metrics_listen = "";
  options.backend = "cpu";
  options.listen = "unix:";
  absl::StatusOr<std::unique_ptr<DequantServer>> server = DequantServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("listen (--listen) unix:"));
  options.listen = "127.0.0.1:0";
  options.max_concurrent_streams = -1;
  server = DequantServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(server.status().message()),
              HasSubstr("max_concurrent_streams (--max-concurrent-streams)"));
}

}  // namespace
}  // namespace dequantd
