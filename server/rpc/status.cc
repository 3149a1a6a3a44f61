// absl::Status -> grpc::Status (see status.h).
#include "server/rpc/status.h"

#include <string>

namespace dequantd {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode both number the canonical codes 0..16 identically.
  static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
                static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));
  static_assert(static_cast<int>(absl::StatusCode::kDataLoss) ==
                static_cast<int>(grpc::StatusCode::DATA_LOSS));
  const int code = static_cast<int>(status.code());
  const grpc::StatusCode grpc_code = code >= 0 && code <= grpc::StatusCode::UNAUTHENTICATED
                                         ? static_cast<grpc::StatusCode>(code)
                                         : grpc::StatusCode::UNKNOWN;
  return grpc::Status(grpc_code, std::string(status.message()));
}

}  // namespace dequantd
