// Parallel, resumable fetching of one Dequantize result: the result is cut into byte ranges
// (DequantizeRequest.offset/length), each fetched over its own connection at the same time and
// delivered in place (a caller's buffer, a file written with pwrite). A range stream that breaks
// (UNAVAILABLE, INTERNAL or CANCELLED from the transport: the server went away, a connection
// reset) is asked again from the last byte received, a bounded number of times. Layers of
// DequantizeLayers are spread over parallel streams the same way, a subset of layers each.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/client.h"

namespace dequantd {

// Results of at least this many bytes are fetched over kDefaultParallelStreams streams when the
// caller leaves the number to us (one stream below it).
inline constexpr int64_t kParallelThresholdBytes = int64_t{64} << 20;
inline constexpr int kDefaultParallelStreams = 4;
inline constexpr int kMaxStreams = 64;  // most streams one fetch opens
// Ranges are cut at multiples of this many bytes (a multiple of every element size).
inline constexpr int64_t kRangeAlignmentBytes = 4096;

// 1 below kParallelThresholdBytes, else kDefaultParallelStreams.
int DefaultStreams(int64_t total_bytes);

// [begin, end) byte ranges covering [0, total_bytes) in order: at most `streams` (>= 1) of them,
// each but the last a multiple of kRangeAlignmentBytes, none empty.
std::vector<std::pair<int64_t, int64_t>> SplitRanges(int64_t total_bytes, int streams);

// Splits layers of `bytes[i]` bytes over at most `streams` streams (largest first onto the least
// loaded): each inner list holds layer indices in ascending order; no list is empty.
std::vector<std::vector<size_t>> SplitLayers(const std::vector<int64_t>& bytes, int streams);

// The size in bytes of `request`'s whole result: K * N * sizeof(output_dtype), from the inline
// shape, or from ListTensors for a named tensor. Errors: NOT_FOUND (a tensor ListTensors does not
// list), INVALID_ARGUMENT (no source; an output dtype that is not fp16/bf16/fp32), ListTensors'.
absl::StatusOr<int64_t> ResultBytes(DequantClient& client, const v1::DequantizeRequest& request);

struct RetryOptions {
  int max_retries = 6;  // re-requests per range after broken streams
  // Before the r-th re-request: min(this * 2^(r - 1), kMaxRetryDelaySeconds). With the defaults
  // 0.2, 0.4, 0.8, 1.6, 2, 2 s: a server restarted within about 7 s is resumed (a linear 0.2 s x r
  // over 4 re-requests gave up after 2 s, while gRPC's reconnect backoff was still waiting;
  // found by the new-user review).
  double retry_delay_seconds = 0.2;
  static constexpr double kMaxRetryDelaySeconds = 2.0;
  double DelayBefore(int retry) const;  // seconds before re-request `retry` (>= 1)
};

// Where a ranged fetch puts the result. on_header (may be empty) is called once, before any
// write_at, with the first header that arrives; write_at is called from several threads at once
// with disjoint [offset, offset + data.size()) byte ranges of the result. A non-OK status from
// either stops the fetch and is returned.
struct RangeSink {
  std::function<absl::Status(const v1::DequantizeHeader& header)> on_header;
  std::function<absl::Status(int64_t offset, absl::Span<const uint8_t> data)> write_at;
};

// Fetches one result (`request` without offset/length) over `streams` range streams, stream i on
// clients[i % clients.size()] (give each client its own connection: DequantClient::Connect with
// distinct `connection` values). `total_bytes` must be the result's size (ResultBytes); a header
// disagreeing with it, or headers disagreeing with each other, is DATA_LOSS. Returns the header.
// Errors: the first failing range's status; after a broken stream whose retries ran out,
// UNAVAILABLE / INTERNAL / CANCELLED "range [B, E): stream broke at byte X after R re-requests:
// <last error>".
absl::StatusOr<v1::DequantizeHeader> FetchRanges(absl::Span<DequantClient* const> clients,
                                                 const v1::DequantizeRequest& request,
                                                 int64_t total_bytes, int streams,
                                                 const RangeSink& sink,
                                                 const RetryOptions& retry = {});

// S clients on distinct connections to one server, with FetchRanges into memory.
class ParallelClient {
 public:
  // `connections` (1..kMaxStreams) clients; the first also serves ResultBytes' ListTensors.
  // Errors: INVALID_ARGUMENT (empty target, connections out of range).
  static absl::StatusOr<std::unique_ptr<ParallelClient>> Connect(const std::string& target,
                                                                 const ClientOptions& options,
                                                                 int connections);
  // Fills `out` (exactly ResultBytes(request) bytes, caller-owned) with the result over
  // `streams` (0 = DefaultStreams) parallel range streams. Errors: FetchRanges', INVALID_ARGUMENT
  // when out has the wrong size.
  absl::StatusOr<v1::DequantizeHeader> DequantizeInto(const v1::DequantizeRequest& request,
                                                      absl::Span<uint8_t> out, int streams = 0,
                                                      const RetryOptions& retry = {});
  // ResultBytes, a buffer of that size, DequantizeInto.
  absl::StatusOr<DequantizedTensor> DequantizeToMemory(const v1::DequantizeRequest& request,
                                                       int streams = 0,
                                                       const RetryOptions& retry = {});

  DequantClient& client(size_t i) { return *clients_[i]; }
  absl::Span<DequantClient* const> clients() const { return pointers_; }

 private:
  std::vector<std::unique_ptr<DequantClient>> clients_;
  std::vector<DequantClient*> pointers_;  // clients_'s, for FetchRanges
};

// Runs DequantizeLayers of the layer lists `subsets` at once, subset i on clients[i %
// clients.size()], each into make_sink(i) (called on the calling thread before the streams
// start; each sink is used by its stream's thread only). Returns every header, subset by subset.
// Errors: the first failing stream's status (the others are cancelled by their own end).
absl::StatusOr<std::vector<v1::DequantizeHeader>> FetchLayerSubsets(
    absl::Span<DequantClient* const> clients, const v1::DequantizeLayersRequest& request,
    const std::vector<std::vector<std::string>>& subsets,
    const std::function<LayersSink(size_t subset)>& make_sink);

}  // namespace dequantd
