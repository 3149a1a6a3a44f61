// Cuts a stream of result bytes, produced in pieces of any size (e.g. blocks of whole rows),
// into the consecutive chunks of exactly `chunk_bytes` that ChunkSink::Write promises.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "server/backend.h"

namespace dequantd {

// Not thread-safe: one per Dequantize call.
class ChunkWriter {
 public:
  // `chunk_bytes` >= 1. `sink` must outlive the writer. `first_offset` (bytes): the result
  // offset of the first byte appended (a byte range's start, ChunkSink::range()); chunks are cut
  // from there.
  ChunkWriter(int64_t chunk_bytes, ChunkSink& sink, int64_t first_offset = 0);

  // Appends the next bytes of the result. Whole chunks go to the sink directly from `bytes`
  // when possible, otherwise through an internal chunk buffer. Returns the sink's error.
  absl::Status Append(absl::Span<const uint8_t> bytes);
  // Sends the last, possibly shorter, chunk. Returns the sink's error.
  absl::Status Finish();

  int64_t bytes_written() const { return offset_ - first_offset_; }  // handed to the sink so far

 private:
  absl::Status Emit(absl::Span<const uint8_t> chunk);

  int64_t chunk_bytes_;
  ChunkSink& sink_;
  const int64_t first_offset_;
  int64_t offset_;                // result offset of the next chunk
  std::vector<uint8_t> pending_;  // a partial chunk; capacity chunk_bytes
};

}  // namespace dequantd
