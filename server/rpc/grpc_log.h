// gRPC's own log (gpr_log) routed through spdlog with a per-call-site rate limit. gRPC 1.51 writes
// one ERROR line to stderr for every request it refuses itself ("Compression algorithm 'gzip' is
// disabled." from call.cc for each gzip'd request under --accept-compressed-requests=false), from
// the thread that serves the connection: when stderr is a pipe nobody drains, that thread blocks
// in write(2) once the pipe is full (about 570 such lines) and every call on that connection
// stalls (docs/hardening.md).
#pragma once

namespace dequantd {

// At most this many lines a minute from each gRPC call site (file:line); then one line saying how
// many were dropped when the next minute's first line is logged.
inline constexpr int kGrpcLogLinesPerMinute = 10;

// Installs the handler (gpr_set_log_function). Idempotent; call before the server starts.
// gRPC's verbosity (GRPC_VERBOSITY, default ERROR) still decides what reaches it.
void InstallGrpcLogHandler();

}  // namespace dequantd
