// Parallel range fetching (client/ranged_fetch.h) against an in-process fake DequantService that
// serves byte ranges of a known result and can break a stream after a given number of bytes
// (UNAVAILABLE, as when the server goes away): the result assembled from S streams equals the
// bytes; a broken stream is asked again from the last byte received; retries are bounded and the
// final error says where the range broke; errors that are not transport failures are not
// retried; and SplitRanges / SplitLayers / DefaultStreams cut as documented.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/ranged_fetch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

using ::testing::HasSubstr;

// A (K, N) fp16 result of known bytes, served in ranges in chunks of 1000 bytes. The first
// `breaks` calls stop with UNAVAILABLE after sending `break_after` bytes of their range.
class RangeService final : public v1::DequantService::Service {
 public:
  RangeService(int64_t K, int64_t N) : K_(K), N_(N), bytes_(static_cast<size_t>(K * N * 2)) {
    for (size_t i = 0; i < bytes_.size(); ++i) bytes_[i] = static_cast<uint8_t>((i * 131) >> 3);
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

  std::atomic<int> breaks{0};
  std::atomic<int64_t> break_after{0};
  grpc::Status error = grpc::Status::OK;  // answered instead of any data when not OK

  std::vector<std::pair<int64_t, int64_t>> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

  grpc::Status ListTensors(grpc::ServerContext*, const v1::ListTensorsRequest*,
                           v1::ListTensorsResponse* response) override {
    v1::QuantizedTensorInfo* info = response->add_tensors();
    info->set_name("layer");
    info->set_in_features(K_);
    info->set_out_features(N_);
    return grpc::Status::OK;
  }

  grpc::Status Dequantize(grpc::ServerContext*, const v1::DequantizeRequest* request,
                          grpc::ServerWriter<v1::DequantizeResponse>* writer) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.emplace_back(request->offset(), request->length());
    }
    if (!error.ok()) return error;
    const int64_t total = static_cast<int64_t>(bytes_.size());
    const int64_t begin = request->offset();
    const int64_t end = request->length() == 0 ? total : begin + request->length();
    const bool broken = breaks.fetch_sub(1) > 0;
    v1::DequantizeResponse response;
    v1::DequantizeHeader* header = response.mutable_header();
    header->add_shape(K_);
    header->add_shape(N_);
    header->set_dtype(v1::DTYPE_FP16);
    header->set_total_bytes(total);
    if (!writer->Write(response)) return grpc::Status::CANCELLED;
    response.clear_header();
    for (int64_t at = begin; at < end; at += 1000) {
      if (broken && at - begin >= break_after) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "server went away");
      }
      const int64_t size = std::min<int64_t>(1000, end - at);
      response.set_offset(at);
      response.set_data(bytes_.data() + at, static_cast<size_t>(size));
      if (!writer->Write(response)) return grpc::Status::CANCELLED;
    }
    return grpc::Status::OK;
  }

 private:
  const int64_t K_, N_;
  std::vector<uint8_t> bytes_;
  std::mutex mu_;
  std::vector<std::pair<int64_t, int64_t>> requests_;
};

class RangedFetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<RangeService>(64, 1024);  // 131072 bytes
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    absl::StatusOr<std::unique_ptr<ParallelClient>> client =
        ParallelClient::Connect("127.0.0.1:" + std::to_string(port), {}, 4);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    request_.set_tensor("layer");
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<RangeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ParallelClient> client_;
  v1::DequantizeRequest request_;
};

TEST_F(RangedFetchTest, FourStreamsAssembleTheWholeResultFromFourRanges) {
  absl::StatusOr<DequantizedTensor> result = client_->DequantizeToMemory(request_, 4);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->data, service_->bytes());
  EXPECT_EQ(result->header.total_bytes(), 131072);
  std::vector<std::pair<int64_t, int64_t>> requests = service_->requests();
  std::sort(requests.begin(), requests.end());
  EXPECT_EQ(requests, (std::vector<std::pair<int64_t, int64_t>>{
                          {0, 32768}, {32768, 32768}, {65536, 32768}, {98304, 32768}}));
}

TEST_F(RangedFetchTest, ABrokenStreamIsAskedAgainFromTheLastByteReceived) {
  service_->breaks = 1;
  service_->break_after = 5000;  // the first call breaks after 5 chunks of 1000 bytes
  absl::StatusOr<DequantizedTensor> result = client_->DequantizeToMemory(
      request_, 1, RetryOptions{.max_retries = 2, .retry_delay_seconds = 0.01});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->data, service_->bytes());
  EXPECT_EQ(service_->requests(),
            (std::vector<std::pair<int64_t, int64_t>>{{0, 131072}, {5000, 126072}}));
}

TEST_F(RangedFetchTest, RetriesAreBoundedAndTheErrorSaysWhereTheRangeBroke) {
  service_->breaks = 100;
  service_->break_after = 3000;
  absl::StatusOr<DequantizedTensor> result = client_->DequantizeToMemory(
      request_, 1, RetryOptions{.max_retries = 2, .retry_delay_seconds = 0.01});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("range [0, 131072): stream broke at byte 9000 after 2 re-requests: "
                        "server went away"));
  EXPECT_EQ(service_->requests().size(), 3u);
}

TEST_F(RangedFetchTest, ErrorsThatAreNotTransportFailuresAreNotRetried) {
  service_->error = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "offset is bad");
  absl::StatusOr<DequantizedTensor> result = client_->DequantizeToMemory(request_, 2);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_->requests().size(), 2u);  // one per range, none again
}

TEST_F(RangedFetchTest, AHeaderDisagreeingWithTheExpectedSizeIsDataLoss) {
  std::vector<uint8_t> buffer(1000);
  absl::StatusOr<v1::DequantizeHeader> header =
      client_->DequantizeInto(request_, absl::MakeSpan(buffer), 1);
  ASSERT_FALSE(header.ok());
  EXPECT_EQ(header.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(header.status().message()), HasSubstr("131072 bytes"));
}

TEST(SplitTest, RangesAreAlignedContiguousAndCoverTheResult) {
  EXPECT_EQ(SplitRanges(100000, 4),
            (std::vector<std::pair<int64_t, int64_t>>{
                {0, 28672}, {28672, 57344}, {57344, 86016}, {86016, 100000}}));
  EXPECT_EQ(SplitRanges(5000, 4),
            (std::vector<std::pair<int64_t, int64_t>>{{0, 4096}, {4096, 5000}}));
  EXPECT_EQ(SplitRanges(4096, 1), (std::vector<std::pair<int64_t, int64_t>>{{0, 4096}}));
  EXPECT_TRUE(SplitRanges(0, 3).empty());
}

TEST(SplitTest, LayersAreBalancedByBytesAndKeepTheirOrderWithinAStream) {
  // 10 + 1 + 1 + 8 + 2: largest first onto the least loaded -> {10}, {8, 2}... in index order.
  const std::vector<std::vector<size_t>> subsets = SplitLayers({10, 1, 1, 8, 2}, 2);
  ASSERT_EQ(subsets.size(), 2u);
  EXPECT_EQ(subsets[0], (std::vector<size_t>{0, 1}));     // 10 + 1
  EXPECT_EQ(subsets[1], (std::vector<size_t>{2, 3, 4}));  // 1 + 8 + 2
  EXPECT_EQ(SplitLayers({5, 5}, 4).size(), 2u);           // never an empty stream
}

TEST(SplitTest, DefaultStreamsIsOneBelow64MBAndFourFromIt) {
  EXPECT_EQ(DefaultStreams((int64_t{64} << 20) - 1), 1);
  EXPECT_EQ(DefaultStreams(int64_t{64} << 20), 4);
}

TEST(RetryOptionsTest, DelaysDoubleFromTheFirstAndStopAtTwoSeconds) {
  const RetryOptions retry;
  EXPECT_EQ(retry.max_retries, 6);
  const double want[] = {0.2, 0.4, 0.8, 1.6, 2.0, 2.0};
  double total = 0;
  for (int r = 1; r <= 6; ++r) {
    EXPECT_DOUBLE_EQ(retry.DelayBefore(r), want[r - 1]) << "re-request " << r;
    total += retry.DelayBefore(r);
  }
  EXPECT_DOUBLE_EQ(total, 7.0);  // a server back within ~7 s is resumed
  const RetryOptions fast{.max_retries = 2, .retry_delay_seconds = 0.01};
  EXPECT_DOUBLE_EQ(fast.DelayBefore(2), 0.02);
}

}  // namespace
}  // namespace dequantd
