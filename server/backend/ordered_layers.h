// One DequantizeLayers call run as several parts at once (one per GPU) while its sink sees exactly
// what one device running them in order would produce. No CUDA here, so it is tested on the CPU
// (tests/server/ordered_layers_test.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/backend/backend.h"
#include "server/backend/lease_pool.h"

namespace dequantd {

// Part k of a call: its entries start at request index `first_entry`, and its results at byte
// `bytes_before` of the call's destination (the results of the entries before it).
struct OrderedPart {
  int64_t first_entry = 0;
  int64_t bytes_before = 0;
};

// Part k's place in its call's order of taking what a part holds while it waits for the parts
// before it (the CUDA backend's request slot). A part that waits in its sink calls while holding
// something the parts before it may need can deadlock: part 1 of call X holds the last slot of
// GPU b waiting for X's part 0, which waits for a slot of GPU a, all held by later parts of other
// calls waiting for their part 0 on GPU b (or, on one GPU, by X's own part 2). Taking slots in
// part order prevents that: a part holding a slot then has every part before it holding one or
// finished, so the call's first unfinished part always runs. Thread-safe per part.
class PartTurn {
 public:
  virtual ~PartTurn() = default;
  // Returns once every part before this one has called Took() or finished; CANCELLED when an
  // earlier part failed (the call is over: take nothing).
  virtual absl::Status Wait() = 0;
  // This part holds its slot: the parts after it may take theirs. Idempotent.
  virtual void Took() = 0;
  // Whether Took() was called: true when the part runs again on another GPU after its own failed
  // (CudaBackend's retry), while later parts of its call may hold slots waiting for it.
  virtual bool took() const = 0;
};

// A lease of `pool` taken in `turn`'s order (turn null: at once, waiting for a free one): waits
// for the turn, then for a free item, then says Took(). A part that took its turn before (a retry
// on another GPU) must not wait: the parts after it may hold every item of `pool` while they wait
// for it, so it takes a free item or gets UNAVAILABLE naming `what`. CANCELLED from Wait().
template <class T>
absl::StatusOr<typename LeasePool<T>::Lease> TakeInTurn(LeasePool<T>& pool, PartTurn* turn,
                                                        absl::string_view what) {
  if (turn == nullptr) return pool.Acquire();
  if (turn->took()) {
    std::optional<typename LeasePool<T>::Lease> free = pool.TryAcquire();
    if (!free.has_value()) {
      return absl::UnavailableError(absl::StrCat(
          "no ", what,
          " is free to run this part of the call again after its GPU failed (the "
          "call's later parts hold them while they wait for it); the next call avoids that GPU"));
    }
    return std::move(*free);
  }
  if (absl::Status s = turn->Wait(); !s.ok()) return s;
  typename LeasePool<T>::Lease lease = pool.Acquire();
  turn->Took();
  return lease;
}

// Runs run(k, sink_k, turn_k) for every part k at once, each on a thread of its own, and serves
// their sink calls on the calling thread, part after part: the first part's Begin (later parts'
// Begin calls are answered OK and not forwarded: the call has one kernel line), BeginLayer with
// call-wide entry indices, Write in order. A part waits in each sink call until the parts before
// it have finished; its destination() is the call's, shifted by its bytes_before (so a part places
// its bytes itself, in parallel). Whatever a part holds across its sink calls it takes between
// turn_k.Wait() and turn_k.Took() (PartTurn). Returns the first error in part order: a part's own,
// or the sink's (the part then stops, and the parts after it get CANCELLED at their next sink
// call or turn). At most one thread per part; every thread is joined before returning. `parts`
// non-empty.
absl::Status RunOrderedParts(
    LayersSink& sink, absl::Span<const OrderedPart> parts,
    const std::function<absl::Status(size_t part, LayersSink& sink, PartTurn& turn)>& run);

// Forwards every call to `inner` and remembers whether any reached it: a call that failed before
// its sink saw anything may be retried on another GPU.
class TouchTrackingSink final : public LayersSink {
 public:
  explicit TouchTrackingSink(ChunkSink& inner, LayersSink* layers = nullptr)
      : inner_(inner), layers_(layers) {}
  bool touched() const { return touched_; }

  const ResultDestination* destination() const override { return inner_.destination(); }
  Range range() const override { return inner_.range(); }
  absl::Status Begin(const std::string& kernel) override {
    touched_ = true;
    return inner_.Begin(kernel);
  }
  absl::Status BeginLayer(int64_t index) override {
    touched_ = true;
    return layers_ != nullptr ? layers_->BeginLayer(index) : absl::OkStatus();
  }
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> bytes) override {
    touched_ = true;
    return inner_.Write(offset, bytes);
  }
  absl::Status WriteShared(int64_t offset, absl::Span<const uint8_t> bytes,
                           std::shared_ptr<const void> keepalive) override {
    touched_ = true;
    return inner_.WriteShared(offset, bytes, std::move(keepalive));
  }

 private:
  ChunkSink& inner_;
  LayersSink* const layers_;
  bool touched_ = false;
};

}  // namespace dequantd
