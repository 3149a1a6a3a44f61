// RegionSink: the result sink of a Dequantize/DequantizeLayers call whose output is a registered
// region. Its destination() is the region at the request's offset when the backend may write it
// directly (a device region, written by the kernel; a pinned host region, by the device-to-host
// copy), and Write is then a progress report, where the sink checks the bounds, the client's
// cancellation and an Unregister of the region. An unpinned host region (the CPU backend's) gets
// the bytes through Write, copied in with GuardedCopy. Nothing goes to the stream
// during the call: the service sends the one reply (every result's header, built from kernel()
// and result_offsets() by the on_begin hook, i.e. while the kernel runs) once the backend has
// returned OK (see DequantService::RunIntoRegion).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "server/backend/backend.h"
#include "server/regions/registry.h"

namespace dequantd::regions {

class RegionSink final : public LayersSink {
 public:
  // How often Write asks `cancelled`: at the first Write, then at most once per this interval.
  // (In gRPC's synchronous API ServerContext::IsCancelled plucks the completion queue, about
  // 6.5 us on the H200 host; a call of many results, e.g. the 224 layers of an 8B model written
  // by one grouped launch, reported one poll per result.) A cancelled call still stops within
  // this interval plus one report's work.
  static constexpr std::chrono::microseconds kCancelPollInterval{1000};

  // `lease`: the region; `region_offset`: where the first result goes, bytes; `result_bytes`:
  // each result's bytes in call order (one for Dequantize), placed one after another. The caller
  // checked region_offset + their sum <= the region's byte_size. `cancelled` (may be empty) is
  // polled by Write (see kCancelPollInterval); `delivered` (may be empty) gets the bytes written
  // into the region, once, when the sink is destroyed (a failed call's bytes included).
  RegionSink(RegionLease lease, int64_t region_offset, std::vector<int64_t> result_bytes,
             std::function<bool()> cancelled,
             std::function<void(RegionKind kind, int64_t bytes)> delivered);
  ~RegionSink() override;
  RegionSink(const RegionSink&) = delete;
  RegionSink& operator=(const RegionSink&) = delete;

  // Each result's offset in the region, bytes (for the headers).
  const std::vector<int64_t>& result_offsets() const { return result_offsets_; }
  // The kernel Begin reported (empty before Begin).
  const std::string& kernel() const { return kernel_; }
  // Runs `hook` in Begin, after kernel() is set: a backend calls Begin right after its first
  // launch, so work done there (the reply's encoding) overlaps the kernel.
  void set_on_begin(std::function<void()> hook) { on_begin_ = std::move(hook); }

  // The region at the offset, when its memory may be written by the backend directly
  // (Region::direct_writes); null otherwise (the bytes then come through Write).
  const ResultDestination* destination() const override {
    return direct_ ? &destination_ : nullptr;
  }
  // Records the kernel and runs the on_begin hook; writes nothing.
  absl::Status Begin(const std::string& kernel) override;
  // INTERNAL for an index outside the call's results.
  absl::Status BeginLayer(int64_t index) override;
  // Errors: CANCELLED (the client went away), ABORTED (the region was unregistered during the
  // call: its bytes are incomplete), FAILED_PRECONDITION (a host region's object was truncated
  // during the call, seen before the write or caught by the guarded copy), INVALID_ARGUMENT (a
  // write outside the current result's bytes, naming region, offset and bytes), the region's CopyIn
  // error.
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> bytes) override;

 private:
  // `cancelled_`, asked at most once per kCancelPollInterval.
  bool PollCancelled();

  RegionLease lease_;
  const std::vector<int64_t> result_bytes_;
  std::vector<int64_t> result_offsets_;  // region offsets, bytes
  const std::function<bool()> cancelled_;
  const std::function<void(RegionKind, int64_t)> delivered_;
  ResultDestination destination_;
  bool direct_ = false;  // Region::direct_writes
  size_t current_ = 0;   // the result being written
  std::string kernel_;
  std::function<void()> on_begin_;
  int64_t delivered_bytes_ = 0;                      // reported to `delivered_` at destruction
  std::chrono::steady_clock::time_point next_poll_;  // when Write next asks `cancelled_`
};

}  // namespace dequantd::regions
