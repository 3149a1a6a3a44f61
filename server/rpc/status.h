// The one mapping from absl::Status (how every library in dequantd reports errors) to
// grpc::Status (what a handler returns). Both use the same canonical code numbers
// (google.rpc.Code); the message is kept as is.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace dequantd {

// Same code, same message. OK maps to OK. Thread-safe (pure function).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace dequantd
