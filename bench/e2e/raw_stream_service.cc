// RawStreamService (see raw_stream_service.h).
#include "bench/e2e/raw_stream_service.h"

#include <algorithm>
#include <string>
#include <utility>

#include "server/rpc/grpc_result_sink.h"
#include "server/rpc/transport_limits.h"

namespace dequantd::e2e {
namespace {

namespace v1 = ::dequant::v1;

}  // namespace

RawStreamService::RawStreamService(std::vector<std::pair<int64_t, int64_t>> shapes)
    : shapes_(std::move(shapes)) {
  int64_t largest = 0;
  for (const auto& [K, N] : shapes_) largest = std::max(largest, K * N * 2);
  bytes_.resize(static_cast<size_t>(largest));
  for (size_t i = 0; i < bytes_.size(); ++i)
    bytes_[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  MarkMethodStreamed(
      1,
      new grpc::internal::BidiStreamingHandler<RawStreamService, v1::DequantizeRequest,
                                               grpc::ByteBuffer>(&RawStreamService::Serve, this));
}

grpc::Status RawStreamService::ListTensors(grpc::ServerContext*, const v1::ListTensorsRequest*,
                                           v1::ListTensorsResponse* response) {
  for (size_t i = 0; i < shapes_.size(); ++i) {
    v1::QuantizedTensorInfo* info = response->add_tensors();
    info->set_name("raw." + std::to_string(i));
    info->set_in_features(shapes_[i].first);
    info->set_out_features(shapes_[i].second);
  }
  return grpc::Status::OK;
}

grpc::Status RawStreamService::Serve(grpc::ServerContext*, Stream* stream) {
  v1::DequantizeRequest request;
  if (!stream->Read(&request))
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request");
  size_t index = shapes_.size();
  for (size_t i = 0; i < shapes_.size(); ++i) {
    if (request.tensor() == "raw." + std::to_string(i)) index = i;
  }
  if (index == shapes_.size()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such tensor");
  const auto [K, N] = shapes_[index];
  const int64_t total = K * N * 2;
  const int64_t begin = std::clamp<int64_t>(request.offset(), 0, total);
  const int64_t end = request.length() == 0 ? total : std::min(total, begin + request.length());
  const int64_t chunk =
      std::clamp<int64_t>(request.chunk_bytes() == 0 ? (1 << 20) : request.chunk_bytes(), 64 << 10,
                          (4 << 20) - (4 << 10));
  v1::DequantizeResponse header_message;
  v1::DequantizeHeader* header = header_message.mutable_header();
  header->add_shape(K);
  header->add_shape(N);
  header->set_dtype(v1::DTYPE_FP16);
  header->set_total_bytes(total);
  header->set_backend("raw");
  grpc::ByteBuffer header_buffer;
  bool own = false;
  grpc::SerializationTraits<v1::DequantizeResponse>::Serialize(header_message, &header_buffer,
                                                               &own);
  if (!stream->Write(header_buffer)) return grpc::Status::CANCELLED;
  for (int64_t at = begin; at < end; at += chunk) {
    const size_t size = static_cast<size_t>(std::min(chunk, end - at));
    const uint8_t* data = bytes_.data() + at;
    grpc::ByteBuffer message;
    switch (encoding_.load()) {
      case Encoding::kZeroCopy: {
        uint8_t prefix[kChunkPrefixMaxBytes];
        const size_t n = EncodeChunkPrefix(at, size, prefix);
        grpc::Slice slices[2] = {grpc::Slice(prefix, n),
                                 grpc::Slice(data, size, grpc::Slice::STATIC_SLICE)};
        message = grpc::ByteBuffer(slices, 2);
        break;
      }
      case Encoding::kOneCopy:
        message = EncodeChunkMessage(at, absl::MakeConstSpan(data, size));
        break;
      case Encoding::kProtobuf: {
        v1::DequantizeResponse response;
        response.set_offset(at);
        response.set_data(data, size);
        bool own_buffer = false;
        grpc::SerializationTraits<v1::DequantizeResponse>::Serialize(response, &message,
                                                                     &own_buffer);
        break;
      }
    }
    if (!stream->Write(message)) return grpc::Status::CANCELLED;
  }
  return grpc::Status::OK;
}

std::unique_ptr<grpc::Server> StartRawServer(RawStreamService* service, const std::string& address,
                                             int* port) {
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  ApplyTransportLimits(TransportLimits(), builder);  // dequantd's defaults
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

}  // namespace dequantd::e2e
