// A DequantizeResponse read straight from the received gRPC message, without copying its data:
// the `data` field is handed out as views into the message's slices (as the transport read
// them), so a result byte is copied once on the client after the socket read, into its
// destination (a caller's buffer, a file), instead of twice (protobuf's parse into a string,
// then the sink). The small `header` is parsed by protobuf.
#pragma once

#include <cstdint>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "dequant/v1/dequant.pb.h"

namespace dequantd {

// One parsed message. The views in `data` point into `slices` (kept alive here): valid until
// the next Parse or the view's destruction.
class ResponseView {
 public:
  // Parses the protobuf wire form of a dequant.v1.DequantizeResponse held in `buffer` (which is
  // left empty): field 1 header (message), 2 offset (varint), 3 data (bytes); unknown fields are
  // skipped; a repeated scalar field keeps its last value, a repeated `data` its last value and
  // a repeated header is merged, as protobuf would. Errors: DATA_LOSS "response message: ..." for
  // a truncated varint or field, an unknown wire type, or a header protobuf cannot parse.
  absl::Status Parse(grpc::ByteBuffer& buffer);

  bool has_header() const { return has_header_; }
  const ::dequant::v1::DequantizeHeader& header() const { return header_; }
  int64_t offset() const { return offset_; }
  // The data bytes, in order, in one or more pieces (none when the message carries no data).
  const std::vector<absl::Span<const uint8_t>>& data() const { return data_; }
  int64_t data_bytes() const { return data_bytes_; }

 private:
  std::vector<grpc::Slice> slices_;
  bool has_header_ = false;
  ::dequant::v1::DequantizeHeader header_;
  int64_t offset_ = 0;
  std::vector<absl::Span<const uint8_t>> data_;
  int64_t data_bytes_ = 0;
};

}  // namespace dequantd
