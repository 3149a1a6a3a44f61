// DequantClient: a small synchronous client for dequant.v1.DequantService (proto/dequant/v1).
// It wraps the generated stub, turns grpc::Status into absl::Status (the codes are the same
// numbers), and reassembles the streamed Dequantize result, checking that the chunks are
// contiguous and add up to the header's total_bytes. Thread-safe: calls may run concurrently
// (the gRPC channel and stub are thread-safe; each call has its own context).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/credentials.h"
#include "dequant/v1/dequant.grpc.pb.h"

namespace dequantd {

namespace v1 = ::dequant::v1;

// grpc::Status -> absl::Status with the same code and message (the enums share their numbers).
absl::Status FromGrpcStatus(const grpc::Status& status);

struct ClientOptions {
  // Largest message the client accepts. Response chunks are at most 4 MiB of payload; 64 MiB
  // leaves room for big ListTensors/Benchmark answers.
  int max_receive_message_bytes = 64 << 20;
  // Largest message the client sends; inline packed requests can be hundreds of MiB. -1 means
  // unlimited (the server's max_request_bytes is the real limit).
  int max_send_message_bytes = -1;
  // Per-call deadline in seconds; 0 = none.
  double deadline_seconds = 0;
  // TLS, mutual TLS and the bearer token (client/credentials.h); default: plaintext, no token.
  ClientSecurityOptions security;
  // gRPC load-balancing policy of the channel: "" = gRPC's default (pick_first: every call on one
  // connection), "round_robin" = each call to the next ready address of a target that resolves to
  // several ("ipv4:10.0.0.1:50051,10.0.0.2:50051", "dns:///headless-service:50051").
  std::string lb_policy;
  // Calls into a shared-memory region (RegionClient, client/shm_client.h): how long the calling
  // thread polls for the reply without sleeping, counted from the call's start, before it blocks;
  // microseconds. A reply within that time is taken as it lands instead of after the thread is
  // woken (the reply leg of a device-region call: 34 us p50 polled against 62 us blocked on the
  // H200 host, docs/performance.md "Region calls: where the time goes"). The price: one busy core
  // for min(call, this) per call, also for calls that outlast it and gain nothing. The default
  // covers a single layer into a device region (0.1-0.4 ms); 0: block at once.
  int64_t region_busy_poll_us = 1'000;
};

// Receives a Dequantize result as it streams in: `on_header` once, then `on_chunk` with
// consecutive bytes of the row-major (K, N) result, starting at offset 0, in pieces of any size
// (views into the received messages as the transport read them, client/response_view.h; valid
// only during the call). A non-OK status from
// either callback cancels the call and is returned by Dequantize.
struct DequantizeSink {
  std::function<absl::Status(const v1::DequantizeHeader& header)> on_header;
  std::function<absl::Status(int64_t offset, absl::Span<const uint8_t> data)> on_chunk;
  // Optional: once per response message that carries data, before its pieces go to on_chunk,
  // with the message's `offset` and data size in bytes (the server's chunking, as sent).
  std::function<void(int64_t offset, int64_t bytes)> on_message;
};

// Receives a DequantizeLayers result as it streams in: per layer, `on_header` (header.tensor
// names it) then `on_chunk` with its consecutive bytes from offset 0. A non-OK status from either
// callback cancels the call and is returned by DequantizeLayers.
using LayersSink = DequantizeSink;

// A whole result in memory (for tests and small layers).
struct DequantizedTensor {
  v1::DequantizeHeader header;
  std::vector<uint8_t> data;  // header.total_bytes bytes, row-major (K, N)
};

// Checks a Dequantize response stream message by message. DequantClient::Dequantize uses it;
// it is public so the checks can be tested without a misbehaving server.
class ResponseStreamChecker {
 public:
  // A stream of the byte range [range_offset, range_offset + range_length) of the result (the
  // request's `offset` and `length`, bytes; length 0 = to the end): the defaults are the whole
  // result.
  explicit ResponseStreamChecker(int64_t range_offset = 0, int64_t range_length = 0)
      : range_offset_(range_offset), range_length_(range_length) {}
  // Accepts the next message. DATA_LOSS if it is malformed: the first message has no header, a
  // later one has one, the header's total_bytes is not shape[0] * shape[1] * sizeof(dtype), the
  // offset is not where the previous data ended (the range's start for the first), or the data
  // runs past the range's end (or total_bytes).
  absl::Status Next(const v1::DequantizeResponse& response);
  // The same for a message given as its parts: its header (null: none), its `offset` and the
  // size of its `data` in bytes.
  absl::Status Next(const v1::DequantizeHeader* header, int64_t offset, int64_t data_bytes);
  // At the end of the stream: DATA_LOSS if no header came or fewer bytes than the range (or
  // total_bytes) arrived.
  absl::Status Finish() const;

  bool has_header() const { return has_header_; }
  const v1::DequantizeHeader& header() const { return header_; }
  int64_t bytes_received() const { return bytes_received_; }  // of the range

 private:
  int64_t RangeEnd() const;  // after the header

  int64_t range_offset_;
  int64_t range_length_;
  bool has_header_ = false;
  v1::DequantizeHeader header_;
  int64_t bytes_received_ = 0;
};

class DequantClient {
 public:
  // A client on a channel to `target` ("host:port" or any gRPC target, e.g. "unix:/path"),
  // plaintext or TLS and with or without a token as options.security says (credentials.h's
  // CreateClientChannel, the one place channels are made). `connection` > 0 gives the channel
  // its own subchannel pool, so clients made with different values (the parallel range streams,
  // ranged_fetch.h) each open their own connection instead of sharing one HTTP/2 connection.
  // Connection happens lazily on the first call. Errors: INVALID_ARGUMENT (empty target;
  // CreateClientChannel's, naming the flag and file).
  static absl::StatusOr<std::unique_ptr<DequantClient>> Connect(const std::string& target,
                                                                const ClientOptions& options = {},
                                                                int connection = 0);
  DequantClient(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options);

  // Each returns the server's status on failure (UNAVAILABLE when it cannot be reached).
  absl::StatusOr<v1::ListTensorsResponse> ListTensors();
  absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo();
  absl::StatusOr<v1::BenchmarkResponse> Benchmark(const v1::BenchmarkRequest& request);

  // Streams one dequantization into `sink` and returns the header. With the request's byte range
  // (`offset`, `length`) set, only that range streams (on_chunk offsets are offsets in the whole
  // result, from `offset`). Errors: the server's status (INVALID_ARGUMENT, NOT_FOUND,
  // RESOURCE_EXHAUSTED, ...), a callback's status, or DATA_LOSS when the stream is malformed: no
  // header first, a second header, a header whose total_bytes disagrees with its shape and dtype,
  // a chunk whose offset is not where the previous one ended, or a total different from the
  // range's (header.total_bytes for the whole result).
  absl::StatusOr<v1::DequantizeHeader> Dequantize(const v1::DequantizeRequest& request,
                                                  const DequantizeSink& sink);
  // Dequantize into memory. Same errors.
  absl::StatusOr<DequantizedTensor> DequantizeToMemory(const v1::DequantizeRequest& request);

  // Streams the layers of a DequantizeLayers call into `sink` and returns their headers in
  // stream order. Errors: as Dequantize, each layer's stream checked as one Dequantize stream
  // (DATA_LOSS also for a layer cut short by the next header, or a header without tensor).
  absl::StatusOr<std::vector<v1::DequantizeHeader>> DequantizeLayers(
      const v1::DequantizeLayersRequest& request, const LayersSink& sink);
  // DequantizeLayers into memory, one DequantizedTensor per layer. Same errors.
  absl::StatusOr<std::vector<DequantizedTensor>> DequantizeLayersToMemory(
      const v1::DequantizeLayersRequest& request);

  // The channel and options (for RegionClient, client/shm_client.h, on the same connection).
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  const ClientOptions& options() const { return options_; }

 private:
  void SetDeadline(grpc::ClientContext* context) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::DequantService::Stub> stub_;
  ClientOptions options_;
};

// Bytes per element of an output dtype (FP16/BF16: 2, FP32/INT32: 4), or 0 if unspecified.
int64_t OutputDTypeBytes(v1::DType dtype);
// "fp16", "bf16", "fp32", "int32", "unspecified".
std::string OutputDTypeName(v1::DType dtype);
// Parses "fp16" / "bf16" / "fp32" (also "float16", "bfloat16", "float32"). INVALID_ARGUMENT
// for anything else.
absl::StatusOr<v1::DType> ParseOutputDType(const std::string& name);
// --orientation: "kn" / "nk" (any case) -> ORIENTATION_KN / ORIENTATION_NK; "" -> UNSPECIFIED (the
// format's own); anything else INVALID_ARGUMENT naming --orientation.
absl::StatusOr<v1::Orientation> ParseOrientation(const std::string& name);

}  // namespace dequantd
