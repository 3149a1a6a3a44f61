// RegionSink: the result sink of a Dequantize/DequantizeLayers call whose output is a registered
// region. Its destination() is the region at the request's offset, so the backend places the
// bytes itself (CPU: computes into it; CUDA: copies device-to-host into a host region, or writes
// a device region with the kernel); Write is then a progress report, where the sink checks the
// bounds, the client's cancellation and an Unregister of the region. Headers go to `headers`
// (the stream's sink), data never does.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "server/backend.h"
#include "server/regions/registry.h"

namespace dequantd::regions {

class RegionSink final : public LayersSink {
 public:
  // `lease`: the region; `region_offset`: where the first result goes, bytes; `result_bytes`:
  // each result's bytes in call order (one for Dequantize), placed one after another. The caller
  // checked region_offset + their sum <= the region's byte_size. `headers` receives Begin and
  // BeginLayer (and must outlive the sink); `cancelled` is polled at every Write; `delivered`
  // (may be empty) gets the bytes of each Write.
  RegionSink(RegionLease lease, int64_t region_offset, std::vector<int64_t> result_bytes,
             LayersSink& headers, std::function<bool()> cancelled,
             std::function<void(RegionKind kind, int64_t bytes)> delivered);

  // Each result's offset in the region, bytes (for the headers).
  const std::vector<int64_t>& result_offsets() const { return result_offsets_; }

  // The region at the offset, when its memory may be written by the backend directly
  // (Region::direct_writes); null otherwise (the bytes then come through Write).
  const ResultDestination* destination() const override {
    return direct_ ? &destination_ : nullptr;
  }
  absl::Status Begin(const std::string& kernel) override;
  absl::Status BeginLayer(int64_t index) override;
  // Errors: CANCELLED (the client went away), ABORTED (the region was unregistered during the
  // call: its bytes are incomplete), FAILED_PRECONDITION (a host region's object was truncated
  // during the call, seen before the write or caught by the guarded copy), INVALID_ARGUMENT (a
  // write outside the current result's bytes, naming region, offset and bytes), the region's CopyIn
  // error.
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> bytes) override;

 private:
  RegionLease lease_;
  const std::vector<int64_t> result_bytes_;
  std::vector<int64_t> result_offsets_;  // region offsets, bytes
  LayersSink& headers_;
  const std::function<bool()> cancelled_;
  const std::function<void(RegionKind, int64_t)> delivered_;
  ResultDestination destination_;
  bool direct_ = false;  // Region::direct_writes
  size_t current_ = 0;   // the result being written
};

}  // namespace dequantd::regions
