// An in-process dequantd for the server tests: CPU backend with one thread, gRPC on an ephemeral
// 127.0.0.1 port (or on `options.listen` when it is a `unix:` address), /metrics only when the
// caller asks for it, and a channel without message-size limits to it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "dequant/v1/dequant.grpc.pb.h"
#include "server/server.h"

namespace dequantd::testing {

struct CpuTestServer {
  std::unique_ptr<DequantServer> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<::dequant::v1::DequantService::Stub> stub;
};

// `with_metrics`: also serve /metrics on 127.0.0.1:0. Every other field of `options` is kept, but
// backend ("cpu"), cpu_threads (1) and a TCP listen address (127.0.0.1:0) are set here.
inline absl::StatusOr<CpuTestServer> StartCpuTestServer(ServerOptions options,
                                                        bool with_metrics = false) {
  const bool unix_socket = options.listen.rfind("unix:", 0) == 0;
  if (!unix_socket) options.listen = "127.0.0.1:0";
  options.metrics_listen = with_metrics ? "127.0.0.1:0" : "";
  options.backend = "cpu";
  options.cpu_threads = 1;
  absl::StatusOr<std::unique_ptr<DequantServer>> server = DequantServer::Start(options);
  if (!server.ok()) return server.status();
  CpuTestServer started;
  started.server = std::move(*server);
  const std::string target =
      unix_socket ? options.listen : "127.0.0.1:" + std::to_string(started.server->port());
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  started.channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  started.stub = ::dequant::v1::DequantService::NewStub(started.channel);
  return started;
}

}  // namespace dequantd::testing
