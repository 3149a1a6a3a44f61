// Requests gRPC could not parse: gRPC 1.51 answers a request that is not a valid protobuf (a
// string field holding non-UTF-8 bytes, garbage) with INTERNAL and an empty message before any
// handler runs, and libprotobuf logs one ERROR line per such request. This rewrites that status
// to INVALID_ARGUMENT carrying libprotobuf's reason, counts the call in
// dequantd_rpc_requests_total, and rate-limits libprotobuf's log (docs/hardening.md).
#pragma once

#include <memory>
#include <string>

#include <grpcpp/support/server_interceptor.h>

namespace dequantd {

class Metrics;

// Routes libprotobuf's log through spdlog, at most `kProtobufLogLinesPerMinute` lines a minute
// (then one line saying how many were dropped), and remembers the last ERROR of each thread for
// the interceptor below. Idempotent; call before the server starts (SetLogHandler is not
// thread-safe).
void InstallProtobufLogHandler();
inline constexpr int kProtobufLogLinesPerMinute = 10;

// The message of the last libprotobuf ERROR logged on this thread since the last call ("" if
// none), e.g. "String field 'dequant.v1.DequantizeRequest.tensor' contains invalid UTF-8 data
// when parsing a protocol buffer. ...". Clears it.
std::string TakeLastProtobufError();

// A server interceptor factory: on the calls of dequant.v1.DequantService, a status INTERNAL with
// an empty message (what gRPC sends when the request does not parse; dequantd's handlers always
// give a message) becomes INVALID_ARGUMENT "request is not a valid dequant.v1.<Method>Request:
// <libprotobuf's reason>", counted under its method in `metrics` (not owned; must outlive the
// server).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeMalformedRequestInterceptorFactory(Metrics* metrics);

}  // namespace dequantd
