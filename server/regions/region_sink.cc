// RegionSink (see region_sink.h).
#include "server/regions/region_sink.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace dequantd::regions {

RegionSink::RegionSink(RegionLease lease, int64_t region_offset, std::vector<int64_t> result_bytes,
                       std::function<bool()> cancelled,
                       std::function<void(RegionKind, int64_t)> delivered)
    : lease_(std::move(lease)),
      result_bytes_(std::move(result_bytes)),
      cancelled_(std::move(cancelled)),
      delivered_(std::move(delivered)) {
  int64_t total = 0;
  for (int64_t bytes : result_bytes_) {
    result_offsets_.push_back(region_offset + total);
    total += bytes;
  }
  const Region& region = lease_.region();
  direct_ = region.direct_writes();
  destination_.memory = region.kind() == RegionKind::kHost ? ResultDestination::Memory::kHost
                                                           : ResultDestination::Memory::kDevice;
  destination_.data = region.data() + region_offset;
  destination_.bytes = total;
  destination_.pinned = region.pinned();
  destination_.device = region.kind() == RegionKind::kDevice ? region.spec().device : -1;
}

RegionSink::~RegionSink() {
  if (delivered_ && delivered_bytes_ > 0) delivered_(lease_.region().kind(), delivered_bytes_);
}

absl::Status RegionSink::Begin(const std::string& kernel) {
  kernel_ = kernel;
  if (on_begin_) on_begin_();
  return absl::OkStatus();
}

absl::Status RegionSink::BeginLayer(int64_t index) {
  if (index < 0 || index >= static_cast<int64_t>(result_bytes_.size())) {
    return absl::InternalError(absl::StrCat("BeginLayer(", index, ") of ", result_bytes_.size()));
  }
  current_ = static_cast<size_t>(index);
  return absl::OkStatus();
}

bool RegionSink::PollCancelled() {
  if (!cancelled_) return false;
  const std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
  if (now < next_poll_) return false;
  next_poll_ = now + kCancelPollInterval;
  return cancelled_();
}

absl::Status RegionSink::Write(int64_t offset, absl::Span<const uint8_t> bytes) {
  if (PollCancelled()) return absl::CancelledError("the client cancelled the call");
  const Region& region = lease_.region();
  if (lease_.closing()) {
    return absl::AbortedError(absl::StrCat("region \"", region.spec().name,
                                           "\" was unregistered while the result was written "
                                           "into it; its bytes are incomplete"));
  }
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (current_ >= result_bytes_.size() || offset < 0 || offset > result_bytes_[current_] ||
      size > result_bytes_[current_] - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region \"", region.spec().name, "\": a write of ", size, " bytes at result offset ",
        offset, " runs past the result's ",
        current_ < result_bytes_.size() ? result_bytes_[current_] : 0, " bytes at region offset ",
        current_ < result_offsets_.size() ? result_offsets_[current_] : 0, " (region byte_size ",
        region.spec().byte_size, ")"));
  }
  // A host object truncated during the call: stop before writing (a pinned region's DMA landed
  // in pages the object no longer holds; an unpinned one's copy would fault).
  if (absl::Status s = region.CheckUsable(); !s.ok()) return s;
  const int64_t region_offset = result_offsets_[current_] + offset;
  // A backend that placed the bytes hands back a pointer into the region; any other (one that
  // does not honour destination()) hands its own buffer, which is copied in here.
  if (bytes.data() != region.data() + region_offset && size > 0) {
    if (absl::Status s = lease_.region().CopyIn(region_offset, bytes); !s.ok()) return s;
  }
  delivered_bytes_ += size;
  return absl::OkStatus();
}

}  // namespace dequantd::regions
