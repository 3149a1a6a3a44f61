// gRPC transport limits (see transport_limits.h).
#include "server/rpc/transport_limits.h"

#include <grpc/compression.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"

namespace dequantd {

absl::Status CheckTransportLimits(const TransportLimits& limits) {
  auto check = [](const char* flag, int64_t value, int64_t min, int64_t max) {
    if (value >= min && value <= max) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " must be in ", min, "..", max, ", got ", value));
  };
  if (absl::Status s = check("--grpc-memory-quota-bytes", limits.memory_quota_bytes,
                             int64_t{1} << 20, int64_t{1} << 40);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = check("--max-threads", limits.max_threads, 4, 4096); !s.ok()) return s;
  return check("--max-streams-per-connection", limits.max_streams_per_connection, 1, 65536);
}

void ApplyTransportLimits(const TransportLimits& limits, grpc::ServerBuilder& builder) {
  if (!limits.accept_compressed_requests) {
    // Only "identity": a request whose grpc-encoding names another algorithm is cancelled with
    // UNIMPLEMENTED ("Compression algorithm 'gzip' is disabled") before decompression.
    builder.AddChannelArgument(GRPC_COMPRESSION_CHANNEL_ENABLED_ALGORITHMS_BITSET,
                               1 << GRPC_COMPRESS_NONE);
  }
  grpc::ResourceQuota quota("dequantd");
  quota.Resize(static_cast<size_t>(limits.memory_quota_bytes));
  quota.SetMaxThreads(limits.max_threads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, limits.max_streams_per_connection);
}

}  // namespace dequantd
