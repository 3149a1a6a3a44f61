// The result pipeline's arithmetic (see result_slabs.h).
#include "server/backend/result_slabs.h"

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_map.h"
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
  // Result -> offset in the current slab, for looking up a result that may repeat. While a
  // slab's results only increase (a direct call's are 0, 1, 2, ...; a whole model asked in order)
  // none can repeat and none is looked up: the map is filled, from the slab's distinct entries,
  // at the slab's first result that does not exceed every one before it. (A map entry per entry
  // cost 225 node allocations per whole-model call.)
  absl::flat_hash_map<int64_t, int64_t> offset_of;
  bool mapped = false;   // offset_of holds every result of the current slab
  int64_t slab_max = 0;  // the current slab's largest result
  for (size_t i = 0; i < entries.size(); ++i) {
    const SlabEntry& entry = entries[i];
    std::optional<int64_t> seen;  // the entry's result's offset, when the slab already has it
    if (!slabs.empty() && (mapped || entry.result <= slab_max)) {
      const Slab& slab = slabs.back();
      if (!mapped) {
        offset_of.reserve(slab.distinct.size());
        for (size_t d : slab.distinct) {
          offset_of.emplace(entries[d].result, slab.offsets[d - slab.first]);
        }
        mapped = true;
      }
      if (const auto it = offset_of.find(entry.result); it != offset_of.end()) seen = it->second;
    }
    if (!seen.has_value()) {
      const int64_t need = aligned(entry.result_bytes);
      const bool full =
          !slabs.empty() && ((slabs.back().bytes > 0 && slabs.back().bytes + need > slab_bytes) ||
                             (entry.staged_bytes > 0 && slabs.back().staged_bytes > 0 &&
                              slabs.back().staged_bytes + entry.staged_bytes > staged_limit));
      if (slabs.empty() || full) {
        slabs.push_back(Slab{
            .first = i, .end = i, .bytes = 0, .staged_bytes = 0, .offsets = {}, .distinct = {}});
        offset_of.clear();
        mapped = false;
        slab_max = entry.result;
      }
      seen = slabs.back().bytes;
      if (mapped) offset_of.emplace(entry.result, *seen);
      slab_max = std::max(slab_max, entry.result);
      slabs.back().bytes += need;
      slabs.back().staged_bytes += entry.staged_bytes;
      slabs.back().distinct.push_back(i);
    }
    slabs.back().offsets.push_back(*seen);
    slabs.back().end = i + 1;
  }
  return slabs;
}

int64_t PieceBytes(int64_t capacity, int64_t chunk_bytes) {
  return chunk_bytes <= capacity ? capacity / chunk_bytes * chunk_bytes : capacity;
}

}  // namespace dequantd
