// The arithmetic of the CUDA backend's result pipeline, kept free of CUDA so it is tested on the
// CPU: which bytes of a result a sink's range selects, how a call's results are cut into slabs of
// bounded device memory, and how a slab's bytes are cut into copy pieces.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/backend/backend.h"

namespace dequantd {

// Bytes [begin, end) of one result.
struct ByteRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The bytes of a `total`-byte result that `range` selects (length -1: to the end). INVALID_ARGUMENT
// naming `offset` or `length` when they are negative or reach past `total` (the service edge
// checks ranges first; this keeps the backend safe on its own).
absl::StatusOr<ByteRange> ResolveRange(const ChunkSink::Range& range, int64_t total);

// One entry of a call, in sink order: which result it delivers (entries with equal `result` are
// the same layer and dtype, computed once per slab) and that result's size in bytes.
struct SlabEntry {
  int64_t result = 0;
  int64_t result_bytes = 0;
  // Device bytes its input needs staged from the host for the launch (0: resident), already
  // rounded up as the caller lays inputs out.
  int64_t staged_bytes = 0;
};

// Consecutive entries [first, end) whose distinct results are computed by one launch into one
// device buffer of `bytes` bytes; `offsets[i - first]` is entry i's result's offset in it
// (duplicates inside the slab share one offset; every offset a multiple of `align`).
struct Slab {
  size_t first = 0;
  size_t end = 0;
  int64_t bytes = 0;
  int64_t staged_bytes = 0;  // the distinct results' staged_bytes: the slab's input buffer
  std::vector<int64_t> offsets;
  std::vector<size_t> distinct;  // entries (indices into the call) that own a result, in order
};

// Cuts `entries` into slabs in order: a slab takes entries while its distinct results, each
// rounded up to `align` bytes, stay within `slab_bytes` and their staged_bytes within
// `staged_limit`; an entry that alone exceeds either gets a slab of its own. So the buffer a slab
// needs is at most max(slab_bytes, largest result rounded up to `align`), its input buffer at most
// max(staged_limit, largest staged_bytes). `slab_bytes`, `staged_limit` >= 1, `align` >= 1. An
// empty list gives no slabs.
std::vector<Slab> PlanSlabs(absl::Span<const SlabEntry> entries, int64_t slab_bytes, int64_t align,
                            int64_t staged_limit = std::numeric_limits<int64_t>::max());

// The bytes of each copy piece when results go out through buffers of `capacity` bytes in
// `chunk_bytes` chunks: the largest multiple of chunk_bytes that fits (so chunks are handed on
// straight from the buffer), or `capacity` when a chunk is larger than a buffer. Both >= 1.
int64_t PieceBytes(int64_t capacity, int64_t chunk_bytes);

}  // namespace dequantd
