// GrpcResultSink and the hand-encoded chunk message (see grpc_result_sink.h).
#include "server/rpc/grpc_result_sink.h"

#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/rpc/request.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

// Protobuf wire tags of DequantizeResponse (proto/dequant/v1/dequant.proto): (field << 3) | type.
constexpr uint8_t kOffsetTag = (2 << 3) | 0;  // int64 offset = 2, varint
constexpr uint8_t kDataTag = (3 << 3) | 2;    // bytes data = 3, length-delimited
constexpr size_t kMaxVarintBytes = 10;

// Writes `value` as a protobuf varint at `out`; returns the bytes written (1..10).
size_t PutVarint(uint64_t value, uint8_t* out) {
  size_t n = 0;
  while (value >= 0x80) {
    out[n++] = static_cast<uint8_t>(value | 0x80);
    value >>= 7;
  }
  out[n++] = static_cast<uint8_t>(value);
  return n;
}

// `response` as one message; INTERNAL naming `what` if protobuf refuses it.
absl::StatusOr<grpc::ByteBuffer> Serialize(const v1::DequantizeResponse& response,
                                           const char* what) {
  grpc::ByteBuffer message;
  bool own_buffer = false;
  if (grpc::Status s = grpc::SerializationTraits<v1::DequantizeResponse>::Serialize(
          response, &message, &own_buffer);
      !s.ok()) {
    return absl::InternalError(absl::StrCat("serializing ", what, ": ", s.error_message()));
  }
  return message;
}

}  // namespace

size_t EncodeChunkPrefix(int64_t offset, size_t data_bytes, uint8_t* out) {
  static_assert(kChunkPrefixMaxBytes == 2 + 2 * kMaxVarintBytes);
  size_t n = 0;
  out[n++] = kOffsetTag;
  n += PutVarint(static_cast<uint64_t>(offset), out + n);
  out[n++] = kDataTag;
  n += PutVarint(data_bytes, out + n);
  return n;
}

grpc::ByteBuffer EncodeChunkMessage(int64_t offset, absl::Span<const uint8_t> data) {
  uint8_t prefix[kChunkPrefixMaxBytes];
  const size_t n = EncodeChunkPrefix(offset, data.size(), prefix);
  // One slice for the whole message: the only copy of the data on its way to the transport
  // (the slice must own its bytes: gRPC may still hold it after Write returns, while the
  // backend reuses its buffer).
  grpc_slice slice = grpc_slice_malloc(n + data.size());
  uint8_t* out = GRPC_SLICE_START_PTR(slice);
  std::memcpy(out, prefix, n);
  if (!data.empty()) std::memcpy(out + n, data.data(), data.size());
  grpc::Slice owned(slice, grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(&owned, 1);
}

grpc::ByteBuffer EncodeSharedChunkMessage(int64_t offset, absl::Span<const uint8_t> data,
                                          std::shared_ptr<const void> keepalive) {
  uint8_t prefix[kChunkPrefixMaxBytes];
  const size_t n = EncodeChunkPrefix(offset, data.size(), prefix);
  grpc::Slice slices[2] = {grpc::Slice(prefix, n), grpc::Slice()};
  if (data.empty()) return grpc::ByteBuffer(slices, 1);
  // The slice's user data is a heap copy of the keepalive, deleted by gRPC's destroy callback
  // when the slice's last reference goes (gRPC does not write through the pointer).
  auto* held = new std::shared_ptr<const void>(std::move(keepalive));
  slices[1] = grpc::Slice(
      grpc_slice_new_with_user_data(
          const_cast<uint8_t*>(data.data()), data.size(),
          [](void* user_data) { delete static_cast<std::shared_ptr<const void>*>(user_data); },
          held),
      grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(slices, 2);
}

void FillHeader(const ResultLayer& result, DType out_dtype, const std::string& backend,
                const std::string& kernel, v1::DequantizeHeader* header) {
  if (result.shape.experts != 1) {
    header->add_shape(result.shape.experts);  // [E, K, N] or [E, N, K]
    header->add_shape(result.shape.expert_rows());
  } else {
    header->add_shape(result.shape.result_rows());
  }
  header->add_shape(result.shape.result_cols());
  header->set_orientation(OrientationToProto(result.shape.orientation));
  header->set_dtype(DTypeToProto(out_dtype));
  header->set_total_bytes(result.shape.output_bytes(out_dtype));
  header->set_backend(backend);
  header->set_kernel(kernel);
  header->set_tensor(result.tensor);
}

absl::StatusOr<grpc::ByteBuffer> EncodeRegionReply(const std::vector<ResultLayer>& results,
                                                   RegionReplyKind kind, DType out_dtype,
                                                   const std::string& backend,
                                                   const std::string& kernel,
                                                   const std::string& region,
                                                   const std::vector<int64_t>& region_offsets) {
  if (region_offsets.size() != results.size() ||
      (kind == RegionReplyKind::kHeader && results.size() != 1)) {
    return absl::InternalError(absl::StrCat("a region reply of ", results.size(), " results with ",
                                            region_offsets.size(), " offsets"));
  }
  if (kind == RegionReplyKind::kSummary) {
    v1::DequantizeResponse response;
    v1::RegionSummary* summary = response.mutable_region_summary();
    int64_t total = 0;
    for (const ResultLayer& result : results) total += result.shape.output_bytes(out_dtype);
    summary->set_layer_count(static_cast<int64_t>(results.size()));
    summary->set_total_bytes(total);
    summary->set_region(region);
    summary->set_region_offset(region_offsets.empty() ? 0 : region_offsets.front());
    summary->set_dtype(DTypeToProto(out_dtype));
    if (!results.empty()) {
      summary->set_orientation(OrientationToProto(results.front().shape.orientation));
    }
    summary->set_backend(backend);
    summary->set_kernel(kernel);
    return Serialize(response, "a region summary");
  }
  // Every header's strings and repeated fields come from one arena, sized for about 500 bytes
  // per header and freed at once (a DequantizeLayers reply of an 8B-shaped model has 224 headers:
  // 210 -> 129 us to encode on the development VM, docs/performance.md).
  google::protobuf::ArenaOptions arena_options;
  arena_options.start_block_size = 1024 + 512 * results.size();
  google::protobuf::Arena arena(arena_options);
  auto* response = google::protobuf::Arena::CreateMessage<v1::DequantizeResponse>(&arena);
  const bool per_layer = kind == RegionReplyKind::kLayerHeaders;
  if (per_layer) response->mutable_layer_headers()->Reserve(static_cast<int>(results.size()));
  for (size_t i = 0; i < results.size(); ++i) {
    v1::DequantizeHeader* header =
        per_layer ? response->add_layer_headers() : response->mutable_header();
    FillHeader(results[i], out_dtype, backend, kernel, header);
    header->set_region(region);
    header->set_region_offset(region_offsets[i]);
  }
  return Serialize(*response, "a region reply");
}

GrpcResultSink::GrpcResultSink(grpc::ServerContext* context, Writer* writer,
                               std::vector<ResultLayer> results, bool per_layer, DType out_dtype,
                               std::string backend, Metrics* metrics, Range range)
    : context_(context),
      writer_(writer),
      results_(std::move(results)),
      per_layer_(per_layer),
      out_dtype_(out_dtype),
      backend_(std::move(backend)),
      metrics_(metrics),
      range_(range) {}

absl::Status GrpcResultSink::Begin(const std::string& kernel) {
  kernel_ = kernel;
  return per_layer_ ? absl::OkStatus() : SendHeader(0);
}

absl::Status GrpcResultSink::BeginLayer(int64_t index) {
  if (index < 0 || index >= static_cast<int64_t>(results_.size())) {
    return absl::InternalError(absl::StrCat("BeginLayer(", index, ") of ", results_.size()));
  }
  return SendHeader(static_cast<size_t>(index));
}

absl::Status GrpcResultSink::Write(int64_t offset, absl::Span<const uint8_t> bytes) {
  return SendData(EncodeChunkMessage(offset, bytes), bytes.size());
}

absl::Status GrpcResultSink::WriteShared(int64_t offset, absl::Span<const uint8_t> bytes,
                                         std::shared_ptr<const void> keepalive) {
  if (keepalive == nullptr) return Write(offset, bytes);
  return SendData(EncodeSharedChunkMessage(offset, bytes, std::move(keepalive)), bytes.size());
}

absl::Status GrpcResultSink::SendData(const grpc::ByteBuffer& message, size_t data_bytes) {
  if (absl::Status s = Send(message); !s.ok()) return s;
  metrics_->AddOutputBytes(static_cast<int64_t>(data_bytes));
  return absl::OkStatus();
}

absl::Status GrpcResultSink::SendHeader(size_t index) {
  v1::DequantizeResponse response;
  FillHeader(results_[index], out_dtype_, backend_, kernel_, response.mutable_header());
  absl::StatusOr<grpc::ByteBuffer> message = Serialize(response, "a header");
  if (!message.ok()) return message.status();
  return Send(*message);
}

absl::Status GrpcResultSink::Send(const grpc::ByteBuffer& message) {
  if (context_->IsCancelled()) {
    return absl::CancelledError("the client cancelled the call");
  }
  StallWatchdog::Write watch(stall_watchdog_, [this] { context_->TryCancel(); });
  if (!writer_->Write(message)) {
    if (watch.stalled()) {
      return absl::DeadlineExceededError(absl::StrCat("the client read nothing for ",
                                                      stall_watchdog_->timeout_seconds(),
                                                      " s (--stall-timeout): call cancelled"));
    }
    return absl::CancelledError("the client closed the stream before the result was sent");
  }
  return absl::OkStatus();
}

}  // namespace dequantd
