// The result pipeline's arithmetic (see result_slabs.h).
#include "server/backend/result_slabs.h"

#include <algorithm>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace dequantd {

absl::StatusOr<ByteRange> ResolveRange(const ChunkSink::Range& range, int64_t total) {
  if (range.offset < 0 || range.offset > total) {
    return absl::InvalidArgumentError(absl::StrCat("offset must be in [0, ", total,
                                                   "] (the result's bytes), got ", range.offset));
  }
  if (range.length < -1 || (range.length >= 0 && range.length > total - range.offset)) {
    return absl::InvalidArgumentError(absl::StrCat("length must be -1 (to the end) or in [0, ",
                                                   total - range.offset, "] for offset ",
                                                   range.offset, ", got ", range.length));
  }
  return ByteRange{.begin = range.offset,
                   .end = range.length < 0 ? total : range.offset + range.length};
}

std::vector<Slab> PlanSlabs(absl::Span<const SlabEntry> entries, int64_t slab_bytes, int64_t align,
                            int64_t staged_limit) {
  auto aligned = [align](int64_t bytes) { return (bytes + align - 1) / align * align; };
  std::vector<Slab> slabs;
  std::unordered_map<int64_t, int64_t> offset_of;  // result -> offset in the current slab
  for (size_t i = 0; i < entries.size(); ++i) {
    const SlabEntry& entry = entries[i];
    const bool seen = !slabs.empty() && offset_of.contains(entry.result);
    if (!seen) {
      const int64_t need = aligned(entry.result_bytes);
      const bool full =
          !slabs.empty() && ((slabs.back().bytes > 0 && slabs.back().bytes + need > slab_bytes) ||
                             (entry.staged_bytes > 0 && slabs.back().staged_bytes > 0 &&
                              slabs.back().staged_bytes + entry.staged_bytes > staged_limit));
      if (slabs.empty() || full) {
        slabs.push_back(Slab{
            .first = i, .end = i, .bytes = 0, .staged_bytes = 0, .offsets = {}, .distinct = {}});
        offset_of.clear();
      }
      offset_of[entry.result] = slabs.back().bytes;
      slabs.back().bytes += need;
      slabs.back().staged_bytes += entry.staged_bytes;
      slabs.back().distinct.push_back(i);
    }
    slabs.back().offsets.push_back(offset_of[entry.result]);
    slabs.back().end = i + 1;
  }
  return slabs;
}

int64_t PieceBytes(int64_t capacity, int64_t chunk_bytes) {
  return chunk_bytes <= capacity ? capacity / chunk_bytes * chunk_bytes : capacity;
}

}  // namespace dequantd
