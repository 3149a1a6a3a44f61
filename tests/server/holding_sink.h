// A ChunkSink for tests that holds what it is lent as the gRPC stream does
// (server/backend/backend.h, ChunkSink::WriteShared): it keeps each chunk's keepalive and reads the
// bytes only when it lets the chunk go.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "server/backend/backend.h"

namespace dequantd::testing {

// Keeps the keepalive of every chunk given with one (WriteShared), as the gRPC stream does until
// the transport sent the bytes, and reads the bytes only when it lets the chunk go, oldest first:
// a staging block reused while still held would show up as bytes different from the reference.
// Holds at most `hold` chunks at once (-1: holds every one until Release is called).
class HoldingSink final : public ChunkSink {
 public:
  HoldingSink(int hold, int64_t total, Range range = {})
      : bytes(static_cast<size_t>(total), 0), hold_(hold), range_(range) {}
  Range range() const override { return range_; }
  absl::Status Begin(const std::string&) override { return absl::OkStatus(); }
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> data) override {
    ++copied_writes;
    Check(offset, data.size());
    std::copy(data.begin(), data.end(), bytes.begin() + offset);
    return absl::OkStatus();
  }
  absl::Status WriteShared(int64_t offset, absl::Span<const uint8_t> data,
                           std::shared_ptr<const void> keepalive) override {
    ++shared_writes;
    if (keepalive == nullptr) null_keepalives = true;
    Check(offset, data.size());
    held_.push_back(Held{offset, data, std::move(keepalive)});
    while (hold_ >= 0 && static_cast<int>(held_.size()) > hold_) ReleaseOldest();
    return absl::OkStatus();
  }
  // Lets every held chunk go (reading its bytes then).
  void Release() {
    while (!held_.empty()) ReleaseOldest();
  }
  size_t held() const { return held_.size(); }

  int copied_writes = 0;
  int shared_writes = 0;
  bool null_keepalives = false;  // WriteShared without a keepalive (breaks its contract)
  bool gaps = false;
  std::vector<int64_t> chunk_sizes;  // every chunk's size, in order
  std::vector<uint8_t> bytes;        // the result's bytes at result offsets, as released

 private:
  struct Held {
    int64_t offset;
    absl::Span<const uint8_t> data;
    std::shared_ptr<const void> keepalive;
  };
  void Check(int64_t offset, size_t size) {
    if (offset != next_ || offset + static_cast<int64_t>(size) > static_cast<int64_t>(bytes.size()))
      gaps = true;
    next_ = offset + static_cast<int64_t>(size);
    chunk_sizes.push_back(static_cast<int64_t>(size));
  }
  void ReleaseOldest() {
    const Held& h = held_.front();
    std::copy(h.data.begin(), h.data.end(), bytes.begin() + h.offset);
    held_.pop_front();
  }

  const int hold_;
  const Range range_;
  int64_t next_ = range_.offset;
  std::deque<Held> held_;
};

}  // namespace dequantd::testing
