// Tests for server/rpc/status: every canonical code maps to the same gRPC code, messages are kept.
#include "server/rpc/status.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

TEST(ToGrpcStatusTest, OkMapsToOkWithEmptyMessage) {
  const grpc::Status status = ToGrpcStatus(absl::OkStatus());
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.error_message(), "");
}

TEST(ToGrpcStatusTest, KeepsMessage) {
  const grpc::Status status =
      ToGrpcStatus(absl::InvalidArgumentError("packed.qweight has 4 bytes, expected 8"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "packed.qweight has 4 bytes, expected 8");
}

// Each pair written out by hand (not derived from the numbering the implementation relies on).
TEST(ToGrpcStatusTest, EveryCanonicalCode) {
  const std::pair<absl::Status, grpc::StatusCode> cases[] = {
      {absl::CancelledError("m"), grpc::StatusCode::CANCELLED},
      {absl::UnknownError("m"), grpc::StatusCode::UNKNOWN},
      {absl::InvalidArgumentError("m"), grpc::StatusCode::INVALID_ARGUMENT},
      {absl::DeadlineExceededError("m"), grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::NotFoundError("m"), grpc::StatusCode::NOT_FOUND},
      {absl::AlreadyExistsError("m"), grpc::StatusCode::ALREADY_EXISTS},
      {absl::PermissionDeniedError("m"), grpc::StatusCode::PERMISSION_DENIED},
      {absl::ResourceExhaustedError("m"), grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::FailedPreconditionError("m"), grpc::StatusCode::FAILED_PRECONDITION},
      {absl::AbortedError("m"), grpc::StatusCode::ABORTED},
      {absl::OutOfRangeError("m"), grpc::StatusCode::OUT_OF_RANGE},
      {absl::UnimplementedError("m"), grpc::StatusCode::UNIMPLEMENTED},
      {absl::InternalError("m"), grpc::StatusCode::INTERNAL},
      {absl::UnavailableError("m"), grpc::StatusCode::UNAVAILABLE},
      {absl::DataLossError("m"), grpc::StatusCode::DATA_LOSS},
      {absl::UnauthenticatedError("m"), grpc::StatusCode::UNAUTHENTICATED},
  };
  for (const auto& [status, expected] : cases) {
    const grpc::Status mapped = ToGrpcStatus(status);
    EXPECT_EQ(mapped.error_code(), expected) << status;
    EXPECT_EQ(mapped.error_message(), "m");
  }
}

TEST(ToGrpcStatusTest, NonCanonicalCodeIsUnknown) {
  const absl::Status odd(static_cast<absl::StatusCode>(42), "odd");
  const grpc::Status mapped = ToGrpcStatus(odd);
  EXPECT_EQ(mapped.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(mapped.error_message(), "odd");
}

}  // namespace
}  // namespace dequantd
