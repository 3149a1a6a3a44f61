// The transport ceiling of the end-to-end benchmark: a minimal dequant.v1 service whose
// Dequantize streams a fixed byte buffer (no computation, no copy: each message is a small
// header slice plus a slice referencing the buffer), honouring offset/length and chunk_bytes
// exactly as dequantd does, so the same client code measures gRPC alone. ListTensors names one
// tensor per shape, "raw.<i>", an fp16 (K, N) result (its bytes: the first K * N * 2 of the
// buffer).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "dequant/v1/dequant.grpc.pb.h"

namespace dequantd::e2e {

class RawStreamService final : public dequant::v1::DequantService::Service {
 public:
  // How a chunk message is built (for measuring the serialization's cost):
  //   kZeroCopy  a prefix slice + a slice referencing the buffer (the transport's ceiling);
  //   kOneCopy   EncodeChunkMessage: the bytes copied once into one slice (what dequantd does);
  //   kProtobuf  DequantizeResponse.set_data + protobuf serialization (dequantd before issue 8:
  //              two copies).
  enum class Encoding { kZeroCopy, kOneCopy, kProtobuf };
  void set_encoding(Encoding encoding) { encoding_ = encoding; }

  // Serves the fp16 results of `shapes` ({K, N} each), all prefixes of one fixed pattern.
  explicit RawStreamService(std::vector<std::pair<int64_t, int64_t>> shapes);
  const std::vector<uint8_t>& bytes() const { return bytes_; }

  grpc::Status ListTensors(grpc::ServerContext* context,
                           const dequant::v1::ListTensorsRequest* request,
                           dequant::v1::ListTensorsResponse* response) override;

 private:
  using Stream = grpc::ServerReaderWriter<grpc::ByteBuffer, dequant::v1::DequantizeRequest>;
  grpc::Status Serve(grpc::ServerContext* context, Stream* stream);

  const std::vector<std::pair<int64_t, int64_t>> shapes_;
  std::vector<uint8_t> bytes_;
  std::atomic<Encoding> encoding_{Encoding::kZeroCopy};
};

// A gRPC server on `address` ("127.0.0.1:0" or "unix:PATH") with the same channel settings as
// dequantd (SO_REUSEPORT off, dequantd's default transport limits: server/rpc/transport_limits.h).
// `port` receives the bound port.
std::unique_ptr<grpc::Server> StartRawServer(RawStreamService* service, const std::string& address,
                                             int* port);

}  // namespace dequantd::e2e
