// ResponseStreamChecker: the client's checks on a Dequantize response stream, message by message.
#include <string>

#include "client/client.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

v1::DequantizeResponse Header(int64_t K, int64_t N, v1::DType dtype, int64_t total_bytes) {
  v1::DequantizeResponse r;
  r.mutable_header()->add_shape(K);
  r.mutable_header()->add_shape(N);
  r.mutable_header()->set_dtype(dtype);
  r.mutable_header()->set_total_bytes(total_bytes);
  return r;
}

v1::DequantizeResponse Chunk(int64_t offset, size_t bytes) {
  v1::DequantizeResponse r;
  r.set_offset(offset);
  r.set_data(std::string(bytes, 'x'));
  return r;
}

TEST(ResponseStreamCheckerTest, AcceptsHeaderThenContiguousChunks) {
  ResponseStreamChecker c;
  v1::DequantizeResponse first = Header(2, 8, v1::DTYPE_FP32, 64);  // 2 * 8 * 4
  first.set_data(std::string(10, 'a'));
  ASSERT_TRUE(c.Next(first).ok());
  ASSERT_TRUE(c.Next(Chunk(10, 50)).ok());
  EXPECT_EQ(c.Finish().code(), absl::StatusCode::kDataLoss);  // 60 of 64 so far
  ASSERT_TRUE(c.Next(Chunk(60, 4)).ok());
  EXPECT_TRUE(c.Finish().ok());
  EXPECT_EQ(c.bytes_received(), 64);
  EXPECT_EQ(c.header().total_bytes(), 64);
}

TEST(ResponseStreamCheckerTest, EmptyResultNeedsOnlyTheHeader) {
  ResponseStreamChecker c;
  ASSERT_TRUE(c.Next(Header(0, 8, v1::DTYPE_FP16, 0)).ok());
  EXPECT_TRUE(c.Finish().ok());
}

TEST(ResponseStreamCheckerTest, ARangeStartsAtItsOffsetAndEndsAtItsLength) {
  ResponseStreamChecker c(/*range_offset=*/16, /*range_length=*/32);
  ASSERT_TRUE(c.Next(Header(2, 8, v1::DTYPE_FP32, 64)).ok());          // the header's offset is 0
  EXPECT_EQ(c.Next(Chunk(0, 8)).code(), absl::StatusCode::kDataLoss);  // not the range's start
  ResponseStreamChecker r(16, 32);
  ASSERT_TRUE(r.Next(Header(2, 8, v1::DTYPE_FP32, 64)).ok());
  ASSERT_TRUE(r.Next(Chunk(16, 24)).ok());
  EXPECT_EQ(r.Finish().code(), absl::StatusCode::kDataLoss);  // 24 of 32
  absl::Status past = r.Next(Chunk(40, 16));                  // runs to 56, the range ends at 48
  EXPECT_EQ(past.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(past.message()).find("runs past the range's end 48"), std::string::npos)
      << past;
  ASSERT_TRUE(r.Next(Chunk(40, 8)).ok());
  EXPECT_TRUE(r.Finish().ok());
  EXPECT_EQ(r.bytes_received(), 32);
  ResponseStreamChecker tail(60);  // length 0: to the end
  ASSERT_TRUE(tail.Next(Header(2, 8, v1::DTYPE_FP32, 64)).ok());
  ASSERT_TRUE(tail.Next(Chunk(60, 4)).ok());
  EXPECT_TRUE(tail.Finish().ok());
}

TEST(ResponseStreamCheckerTest, EachMalformedStreamIsDataLoss) {
  {
    ResponseStreamChecker c;  // no header first
    EXPECT_EQ(c.Next(Chunk(0, 4)).code(), absl::StatusCode::kDataLoss);
  }
  {
    ResponseStreamChecker c;  // stream ended with nothing
    EXPECT_EQ(c.Finish().code(), absl::StatusCode::kDataLoss);
  }
  {
    ResponseStreamChecker c;  // total_bytes disagrees with (K, N) fp16: 2 * 8 * 2 = 32
    EXPECT_EQ(c.Next(Header(2, 8, v1::DTYPE_FP16, 33)).code(), absl::StatusCode::kDataLoss);
  }
  {
    ResponseStreamChecker c;  // neither (K, N) nor (E, K, N)
    v1::DequantizeResponse r = Header(2, 8, v1::DTYPE_FP16, 32);
    r.mutable_header()->add_shape(1);
    r.mutable_header()->add_shape(1);
    EXPECT_EQ(c.Next(r).code(), absl::StatusCode::kDataLoss);
  }
  {
    ResponseStreamChecker c;  // (E, K, N) = (3, 2, 8) fp16 is 96 bytes, not 32
    v1::DequantizeResponse r = Header(3, 2, v1::DTYPE_FP16, 32);
    r.mutable_header()->add_shape(8);
    EXPECT_EQ(c.Next(r).code(), absl::StatusCode::kDataLoss);
    ResponseStreamChecker ok;  // an mxfp4 layer's stacked result
    r.mutable_header()->set_total_bytes(96);
    EXPECT_TRUE(ok.Next(r).ok());
  }
  {
    ResponseStreamChecker c;  // dtype not a float
    EXPECT_EQ(c.Next(Header(2, 8, v1::DTYPE_UNSPECIFIED, 0)).code(), absl::StatusCode::kDataLoss);
  }
  {
    ResponseStreamChecker c;  // gap
    ASSERT_TRUE(c.Next(Header(2, 8, v1::DTYPE_FP16, 32)).ok());
    ASSERT_TRUE(c.Next(Chunk(0, 8)).ok());
    EXPECT_EQ(c.Next(Chunk(10, 8)).code(), absl::StatusCode::kDataLoss);
  }
  {
    ResponseStreamChecker c;  // overlap
    ASSERT_TRUE(c.Next(Header(2, 8, v1::DTYPE_FP16, 32)).ok());
    ASSERT_TRUE(c.Next(Chunk(0, 8)).ok());
    EXPECT_EQ(c.Next(Chunk(4, 8)).code(), absl::StatusCode::kDataLoss);
  }
  {
    ResponseStreamChecker c;  // past total_bytes
    ASSERT_TRUE(c.Next(Header(2, 8, v1::DTYPE_FP16, 32)).ok());
    EXPECT_EQ(c.Next(Chunk(0, 33)).code(), absl::StatusCode::kDataLoss);
  }
  {
    ResponseStreamChecker c;  // second header
    ASSERT_TRUE(c.Next(Header(2, 8, v1::DTYPE_FP16, 32)).ok());
    EXPECT_EQ(c.Next(Header(2, 8, v1::DTYPE_FP16, 32)).code(), absl::StatusCode::kDataLoss);
  }
}

TEST(FromGrpcStatusTest, KeepsCodeAndMessage) {
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "too big")),
            absl::ResourceExhaustedError("too big"));
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "no layer")),
            absl::NotFoundError("no layer"));
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "x")).code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(OutputDTypeTest, ParseAndNames) {
  EXPECT_EQ(*ParseOutputDType("fp16"), v1::DTYPE_FP16);
  EXPECT_EQ(*ParseOutputDType("BFloat16"), v1::DTYPE_BF16);
  EXPECT_EQ(*ParseOutputDType("fp32"), v1::DTYPE_FP32);
  EXPECT_EQ(ParseOutputDType("int32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OutputDTypeBytes(v1::DTYPE_BF16), 2);
  EXPECT_EQ(OutputDTypeBytes(v1::DTYPE_FP32), 4);
  EXPECT_EQ(OutputDTypeBytes(v1::DTYPE_UNSPECIFIED), 0);
  EXPECT_EQ(OutputDTypeName(v1::DTYPE_BF16), "bf16");
}

}  // namespace
}  // namespace dequantd
