// The gRPC transport settings that bound what one client can make the server hold
// (docs/hardening.md): request compression, memory and thread quotas, streams per connection.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace grpc {
class ServerBuilder;
}  // namespace grpc

namespace dequantd {

struct TransportLimits {
  // Accept gzip/deflate-compressed requests. false (the default): refused with UNIMPLEMENTED when
  // their headers arrive (identity-only compression), before anything is inflated. true: gRPC's
  // own handling (1.51.1 refused a request inflating to 128 MiB against a 1 MiB limit with
  // RESOURCE_EXHAUSTED after 17 MiB of peak RSS growth). gRPC logs each refusal; dequantd
  // rate-limits that log (server/rpc/grpc_log.h: the log once stalled a connection,
  // docs/hardening.md).
  bool accept_compressed_requests = false;
  // gRPC ResourceQuota memory for transport buffers (bytes; 1 MiB..1 TiB). Under pressure gRPC
  // shrinks its read buffers and flow-control windows.
  int64_t memory_quota_bytes = int64_t{1} << 30;
  // ResourceQuota thread limit: the synchronous server's threads, so at most about this many
  // calls run at once; a call that finds no thread gets RESOURCE_EXHAUSTED. 4..4096.
  int max_threads = 256;
  // HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS per connection (1..65536).
  int max_streams_per_connection = 64;
};

// INVALID_ARGUMENT naming the flag when a limit is out of its range.
absl::Status CheckTransportLimits(const TransportLimits& limits);

// Applies `limits` to `builder` (before BuildAndStart).
void ApplyTransportLimits(const TransportLimits& limits, grpc::ServerBuilder& builder);

}  // namespace dequantd
