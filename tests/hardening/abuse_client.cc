// The abusive client's requests and the dequantd child (see abuse_client.h).
#include "tests/hardening/abuse_client.h"

#include <grpc/compression.h>
#include <grpcpp/generic/generic_stub.h>

#include <cstdlib>

#include "tests/hardening/process_stats.h"

namespace dequantd::testing {
namespace {

std::vector<std::string> WithBaseFlags(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--model=", "--listen=127.0.0.1:0",
                                   "--metrics-listen=127.0.0.1:0", "--backend=cpu",
                                   "--cpu-threads=2"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace

DequantdChild::DequantdChild(const std::vector<std::string>& extra, unsigned alarm_seconds)
    : process(WithBaseFlags(extra), alarm_seconds) {
  port = process.ListeningPort();
  const std::string marker = "metrics on http://127.0.0.1:";
  if (port > 0 && process.ReadUntil(marker) && process.ReadUntil("/metrics")) {
    metrics_port =
        std::atoi(process.output().c_str() + process.output().find(marker) + marker.size());
  }
}

std::shared_ptr<grpc::Channel> DequantdChild::Channel() const {
  return grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                             grpc::InsecureChannelCredentials());
}

double DequantdChild::Metric(const std::string& series) const {
  return MetricValue(HttpGet(metrics_port, "/metrics"), series);
}

grpc::Status SendCompressed(dequant::v1::DequantService::Stub& stub,
                            const dequant::v1::DequantizeRequest& request) {
  grpc::ClientContext context;
  context.set_compression_algorithm(GRPC_COMPRESS_GZIP);
  std::unique_ptr<grpc::ClientReader<dequant::v1::DequantizeResponse>> reader =
      stub.Dequantize(&context, request);
  dequant::v1::DequantizeResponse response;
  while (reader->Read(&response)) {
  }
  return reader->Finish();
}

grpc::Status CallWithRawRequest(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& method, const std::string& bytes) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  auto call = stub.PrepareUnaryCall(&context, method, request, &cq);
  call->StartCall();
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  return status;
}

}  // namespace dequantd::testing
