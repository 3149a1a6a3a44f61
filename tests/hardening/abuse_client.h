// What the hardening and soak tests share: a dequantd child process with its ports, and the
// requests an abusive client sends (gzip-compressed, raw bytes that are not protobuf).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "dequant/v1/dequant.grpc.pb.h"
#include "tests/server/dequantd_process.h"

namespace dequantd::testing {

// A dequantd child on 127.0.0.1 with the CPU backend (2 threads), no model, /metrics on a free
// port, plus `extra` flags (later flags win); its gRPC and metrics ports (0 if it did not start).
struct DequantdChild {
  explicit DequantdChild(const std::vector<std::string>& extra, unsigned alarm_seconds = 120);
  std::shared_ptr<grpc::Channel> Channel() const;
  // The value of a /metrics sample line (see MetricValue), -1 if absent.
  double Metric(const std::string& series) const;

  DequantdProcess process;
  int port = 0;
  int metrics_port = 0;
};

// Sends `request` gzip-compressed and reads the stream to its status.
grpc::Status SendCompressed(dequant::v1::DequantService::Stub& stub,
                            const dequant::v1::DequantizeRequest& request);

// Calls `method` (e.g. "/dequant.v1.DequantService/Dequantize") with `bytes` as the serialized
// request, through the generic stub (unary framing: a streaming method's error status arrives
// the same way).
grpc::Status CallWithRawRequest(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& method, const std::string& bytes);

}  // namespace dequantd::testing
