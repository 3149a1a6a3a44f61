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
  // Accept gzip/deflate-compressed requests. Off by default: gRPC 1.51 inflates a compressed
  // message whole before any size check (its decompress filter compares only the compressed
  // length with the receive limit), so a 1 MB request can make the server allocate 1 GiB.
  // Off, such a request is refused with UNIMPLEMENTED when its headers arrive, before its body
  // is read. Responses may still be compressed.
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
