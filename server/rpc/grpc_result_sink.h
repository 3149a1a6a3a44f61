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
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dequant/v1/dequant.pb.h"
#include "server/backend/backend.h"
#include "server/metrics/metrics.h"
#include "server/rpc/request.h"
#include "server/rpc/stall_watchdog.h"

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
  QuantShape shape;
};

// Fills `header` for `result` computed by `kernel` on `backend` into `out_dtype` (region and
// region_offset are left unset).
void FillHeader(const ResultLayer& result, DType out_dtype, const std::string& backend,
                const std::string& kernel, dequant::v1::DequantizeHeader* header);

// The one reply of an output_region call (issue 9), serialized, as `kind` says: kHeader
// (Dequantize, one result) a DequantizeResponse whose `header` is the result's; kLayerHeaders
// (DequantizeLayers) one whose `layer_headers` hold every result's header in call order, each
// naming `region` and carrying its result's offset there (`region_offsets`, bytes, one per
// result); kSummary (DequantizeLayers, issue 23) one whose `region_summary` alone says how many
// results, their total bytes, the region, the first result's offset, dtype, orientation, backend
// and kernel (no per-result field: its size does not grow with the results). Errors: INTERNAL
// (the offsets do not match the results, or kHeader with other than one result; serialization
// failed).
absl::StatusOr<grpc::ByteBuffer> EncodeRegionReply(const std::vector<ResultLayer>& results,
                                                   RegionReplyKind kind, DType out_dtype,
                                                   const std::string& backend,
                                                   const std::string& kernel,
                                                   const std::string& region,
                                                   const std::vector<int64_t>& region_offsets);

// Streams Dequantize or DequantizeLayers results to the client: per result a header message,
// then its data chunks. For Dequantize (one result, `per_layer` false) the header goes out at
// Begin; for DequantizeLayers at each BeginLayer, carrying the layer's name. `range` is the byte
// range of the (single) result the client asked for (the whole result by default). Calls into a
// region do not use it (their one reply is EncodeRegionReply's).
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

 private:
  absl::Status SendHeader(size_t index);
  // Checks ServerContext::IsCancelled, then writes `message` (blocking, under the watchdog).
  absl::Status Send(const grpc::ByteBuffer& message);
  // Send for a data chunk carrying `data_bytes` result bytes, counted in the output-bytes metric.
  absl::Status SendData(const grpc::ByteBuffer& message, size_t data_bytes);

  grpc::ServerContext* const context_;
  Writer* const writer_;
  const std::vector<ResultLayer> results_;
  const bool per_layer_;
  const DType out_dtype_;
  const std::string backend_;
  Metrics* const metrics_;
  const Range range_;
  std::string kernel_;
  StallWatchdog* stall_watchdog_ = nullptr;
};

}  // namespace dequantd
