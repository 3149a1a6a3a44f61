// One DequantizeLayers call run as several parts at once (one per GPU) while its sink sees exactly
// what one device running them in order would produce. No CUDA here, so it is tested on the CPU
// (tests/server/ordered_layers_test.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "server/backend/backend.h"

namespace dequantd {

// Part k of a call: its entries start at request index `first_entry`, and its results at byte
// `bytes_before` of the call's destination (the results of the entries before it).
struct OrderedPart {
  int64_t first_entry = 0;
  int64_t bytes_before = 0;
};

// Runs run(k, sink_k) for every part k at once, each on a thread of its own, and serves their
// sink calls on the calling thread, part after part: the first part's Begin (later parts' Begin
// calls are answered OK and not forwarded: the call has one kernel line), BeginLayer with
// call-wide entry indices, Write in order. A part waits in each sink call until the parts before
// it have finished; its destination() is the call's, shifted by its bytes_before (so a part places
// its bytes itself, in parallel). Returns the first error in part order: a part's own, or the
// sink's (the part then stops, and the parts after it get CANCELLED at their next sink call). At
// most one thread per part; every thread is joined before returning. `parts` non-empty.
absl::Status RunOrderedParts(LayersSink& sink, absl::Span<const OrderedPart> parts,
                             const std::function<absl::Status(size_t part, LayersSink& sink)>& run);

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
