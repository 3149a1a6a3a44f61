// A registered shared-memory region: memory of a client on the same host that the server writes
// results into (a host mapping of a POSIX shared-memory object, or a client's CUDA buffer opened
// with CUDA IPC). Created by OpenHostRegion / OpenCudaRegion, held by the RegionRegistry; the
// memory stays mapped/open until the Region is destroyed (after Unregister, once no call writes
// into it any more).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace dequantd::regions {

enum class RegionKind { kHost, kDevice };

// "host" or "device".
const char* RegionKindName(RegionKind kind);

// What a client asked for at registration.
struct RegionSpec {
  std::string name;       // unique among all regions, 1..128 bytes of [A-Za-z0-9._-]
  std::string key;        // host: the shm name ("/x") or path under /dev/shm; device: empty
  int device = -1;        // device: CUDA ordinal; host: -1
  int64_t offset = 0;     // bytes into the object / allocation, >= 0
  int64_t byte_size = 0;  // bytes, >= 1
  std::string owner;      // the peer that registered it, e.g. "ipv4:127.0.0.1:41234"
};

// Thread-safe after construction: data() is constant; CopyIn may run from many calls at once
// (into disjoint bytes, which the sinks guarantee by bounds checks per call).
class Region {
 public:
  explicit Region(RegionSpec spec) : spec_(std::move(spec)) {}
  virtual ~Region() = default;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  const RegionSpec& spec() const { return spec_; }
  virtual RegionKind kind() const = 0;
  // The region's first byte (host: in this process's mapping; device: a device pointer on
  // spec().device). spec().byte_size bytes from here belong to the region.
  virtual uint8_t* data() const = 0;
  // Host: registered with cudaHostRegister (device-to-host DMA can land in it directly).
  virtual bool pinned() const { return false; }
  // Whether a backend may write data() itself (its threads, or DMA) as the call's
  // ResultDestination. False for a host mapping that is not pinned: the client may truncate its
  // object at any time, and a CPU write to a page past the new end raises SIGBUS, so those bytes
  // go through RegionSink::Write and CopyIn, which copies with GuardedCopy (guarded_copy.h). A
  // pinned mapping keeps its pages for DMA when the object shrinks: written directly.
  virtual bool direct_writes() const { return true; }
  // OK when the region can be written now. Host: FAILED_PRECONDITION when its object was
  // truncated below offset + byte_size since registration (a write would fault). Checked at
  // the start of every call that writes into it, and at every Write of its sink.
  virtual absl::Status CheckUsable() const { return absl::OkStatus(); }
  // Copies host `bytes` to byte `offset` of the region (the sink's fallback when a backend did
  // not place the bytes itself). The caller checked offset + bytes.size() <= byte_size.
  // Errors: INTERNAL from the device; FAILED_PRECONDITION for a host region whose object was
  // truncated during the copy (the copy faulted, GuardedCopy caught it; the bytes are incomplete).
  virtual absl::Status CopyIn(int64_t offset, absl::Span<const uint8_t> bytes) = 0;

 private:
  const RegionSpec spec_;
};

}  // namespace dequantd::regions
