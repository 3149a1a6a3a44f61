// The gRPC stream as a result sink: DequantizeResponse messages written to a server stream as
// grpc::ByteBuffers. Headers are serialized by protobuf; data chunks are encoded by hand (the
// `offset` and `data` fields of DequantizeResponse around the bytes). Bytes given with a keepalive
// (ChunkSink::WriteShared: the CUDA backend's pinned staging blocks) are not copied at all: the
// message references them, and the keepalive is dropped when gRPC releases the message. Other
// bytes are copied once, into the message's slice (instead of twice: into a protobuf `bytes`
// field, then by its serialization).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "dequant/v1/dequant.pb.h"
#include "server/backend.h"
#include "server/metrics.h"
#include "server/stall_watchdog.h"

namespace dequantd {

// The most bytes EncodeChunkPrefix writes.
inline constexpr size_t kChunkPrefixMaxBytes = 22;

// Writes the protobuf bytes of a DequantizeResponse that come before its `data` bytes when it
// carries `offset` and `data_bytes` bytes of data (no header): the `offset` field (tag, varint),
// then the `data` field's tag and length. Returns the bytes written (<= kChunkPrefixMaxBytes).
size_t EncodeChunkPrefix(int64_t offset, size_t data_bytes, uint8_t* out);

// The wire form of a DequantizeResponse carrying `offset` and `data` only (no header): field 2
// (varint) then field 3 (length-delimited), in one slice. Parses back to the same message.
grpc::ByteBuffer EncodeChunkMessage(int64_t offset, absl::Span<const uint8_t> data);

// The same message without copying `data`: two slices, the prefix (EncodeChunkPrefix, copied)
// and a slice referencing `data` itself, which holds a copy of `keepalive` (non-null) until gRPC
// and every ByteBuffer (or copy) holding it are done; the copy is dropped then, on whichever
// thread releases the last reference. `data` must stay valid and unchanged while `keepalive`
// lives.
grpc::ByteBuffer EncodeSharedChunkMessage(int64_t offset, absl::Span<const uint8_t> data,
                                          std::shared_ptr<const void> keepalive);

// One result a GrpcResultSink streams: its layer name (empty for Dequantize) and shape.
struct ResultLayer {
  std::string tensor;
  AwqShape shape;
};

// Streams Dequantize or DequantizeLayers results to the client: per result a header message,
// then its data chunks. For Dequantize (one result, `per_layer` false) the header goes out at
// Begin; for DequantizeLayers at each BeginLayer, carrying the layer's name. `range` is the byte
// range of the (single) result the client asked for (the whole result by default).
// Not thread-safe: one per call, used on the call's thread.
class GrpcResultSink final : public LayersSink {
 public:
  using Writer = grpc::internal::WriterInterface<grpc::ByteBuffer>;
  // Every pointer must outlive the sink.
  GrpcResultSink(grpc::ServerContext* context, Writer* writer, std::vector<ResultLayer> results,
                 bool per_layer, DType out_dtype, std::string backend, Metrics* metrics,
                 Range range = {});

  Range range() const override { return range_; }
  absl::Status Begin(const std::string& kernel) override;
  absl::Status BeginLayer(int64_t index) override;
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> bytes) override;
  // No copy: the message references `bytes` and holds `keepalive` until gRPC releases it.
  absl::Status WriteShared(int64_t offset, absl::Span<const uint8_t> bytes,
                           std::shared_ptr<const void> keepalive) override;

  // Writes that block longer than its timeout are cancelled (null: never; --stall-timeout).
  void set_stall_watchdog(StallWatchdog* watchdog) { stall_watchdog_ = watchdog; }

  // Headers from now on name `region` and carry each result's offset in it, bytes (output_region
  // calls, issue 9: the data then goes to the region, not the stream). They are written without
  // polling IsCancelled first (in the synchronous API it plucks the completion queue, ~6.5 us on
  // the H200 host, and the region sink polls it already): a cancelled call's Write fails anyway.
  // (gRPC's buffer hint was tried for them: a synchronous Write with it blocked ~0.3 s, until
  // the transport flushed on its own.)
  void set_region(std::string region, std::vector<int64_t> offsets) {
    region_ = std::move(region);
    region_offsets_ = std::move(offsets);
  }

 private:
  absl::Status SendHeader(size_t index);
  // `poll_cancelled`: check ServerContext::IsCancelled before writing.
  absl::Status Send(const grpc::ByteBuffer& message, bool poll_cancelled = true);

  grpc::ServerContext* const context_;
  Writer* const writer_;
  const std::vector<ResultLayer> results_;
  const bool per_layer_;
  const DType out_dtype_;
  const std::string backend_;
  Metrics* const metrics_;
  const Range range_;
  std::string kernel_;
  std::string region_;                   // output_region calls: the region's name
  std::vector<int64_t> region_offsets_;  // and each result's offset in it, bytes
  StallWatchdog* stall_watchdog_ = nullptr;
};

}  // namespace dequantd
