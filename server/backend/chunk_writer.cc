// ChunkWriter (see chunk_writer.h).
#include "server/backend/chunk_writer.h"

#include <algorithm>

namespace dequantd {

ChunkWriter::ChunkWriter(int64_t chunk_bytes, ChunkSink& sink, int64_t first_offset)
    : chunk_bytes_(std::max<int64_t>(chunk_bytes, 1)),
      sink_(sink),
      first_offset_(first_offset),
      offset_(first_offset) {}

absl::Status ChunkWriter::Emit(absl::Span<const uint8_t> chunk,
                               const std::shared_ptr<const void>& keepalive) {
  absl::Status status = keepalive != nullptr ? sink_.WriteShared(offset_, chunk, keepalive)
                                             : sink_.Write(offset_, chunk);
  offset_ += static_cast<int64_t>(chunk.size());
  return status;
}

absl::Status ChunkWriter::Append(absl::Span<const uint8_t> bytes,
                                 const std::shared_ptr<const void>& keepalive) {
  return Cut(bytes, keepalive, /*last=*/false);
}

absl::Status ChunkWriter::AppendLast(absl::Span<const uint8_t> bytes,
                                     const std::shared_ptr<const void>& keepalive) {
  if (absl::Status s = Cut(bytes, keepalive, /*last=*/true); !s.ok()) return s;
  return Finish();
}

absl::Status ChunkWriter::Cut(absl::Span<const uint8_t> bytes,
                              const std::shared_ptr<const void>& keepalive, bool last) {
  while (!bytes.empty()) {
    if (pending_.empty() && (static_cast<int64_t>(bytes.size()) >= chunk_bytes_ || last)) {
      const size_t take = std::min(bytes.size(), static_cast<size_t>(chunk_bytes_));
      if (absl::Status s = Emit(bytes.subspan(0, take), keepalive); !s.ok()) return s;
      bytes.remove_prefix(take);
      continue;
    }
    const size_t take = std::min(bytes.size(), static_cast<size_t>(chunk_bytes_) - pending_.size());
    pending_.insert(pending_.end(), bytes.begin(), bytes.begin() + take);
    bytes.remove_prefix(take);
    if (static_cast<int64_t>(pending_.size()) == chunk_bytes_) {
      absl::Status s = Emit(pending_);
      pending_.clear();
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ChunkWriter::Finish() {
  if (pending_.empty()) return absl::OkStatus();
  absl::Status s = Emit(pending_);
  pending_.clear();
  return s;
}

}  // namespace dequantd
