// Cuts a stream of result bytes, produced in pieces of any size (e.g. blocks of whole rows),
// into the consecutive chunks of exactly `chunk_bytes` that ChunkSink::Write promises.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "server/backend/backend.h"

namespace dequantd {

// Not thread-safe: one per Dequantize call.
class ChunkWriter {
 public:
  // `chunk_bytes` >= 1. `sink` must outlive the writer. `first_offset` (bytes): the result
  // offset of the first byte appended (a byte range's start, ChunkSink::range()); chunks are cut
  // from there.
  ChunkWriter(int64_t chunk_bytes, ChunkSink& sink, int64_t first_offset = 0);

  // Appends the next bytes of the result. Whole chunks go to the sink directly from `bytes`
  // when possible, otherwise through an internal chunk buffer. With a `keepalive` (non-null: the
  // bytes stay valid while it lives, ChunkSink::WriteShared), the chunks cut straight from
  // `bytes` go to WriteShared with it; chunks assembled in the internal buffer (a copy) go to
  // Write. Returns the sink's error.
  absl::Status Append(absl::Span<const uint8_t> bytes,
                      const std::shared_ptr<const void>& keepalive = nullptr);
  // Append, then Finish, except that a last short chunk lying whole in `bytes` (nothing pending
  // before it) goes to the sink straight from `bytes` too (with the keepalive), not through the
  // internal buffer: the last piece of a result costs no copy either.
  absl::Status AppendLast(absl::Span<const uint8_t> bytes,
                          const std::shared_ptr<const void>& keepalive = nullptr);
  // Sends the last, possibly shorter, chunk. Returns the sink's error.
  absl::Status Finish();

  int64_t bytes_written() const { return offset_ - first_offset_; }  // handed to the sink so far

 private:
  // `last`: a short chunk at the end of `bytes` is sent too, not kept pending.
  absl::Status Cut(absl::Span<const uint8_t> bytes, const std::shared_ptr<const void>& keepalive,
                   bool last);
  absl::Status Emit(absl::Span<const uint8_t> chunk,
                    const std::shared_ptr<const void>& keepalive = nullptr);

  int64_t chunk_bytes_;
  ChunkSink& sink_;
  const int64_t first_offset_;
  int64_t offset_;                // result offset of the next chunk
  std::vector<uint8_t> pending_;  // a partial chunk; capacity chunk_bytes
};

}  // namespace dequantd
