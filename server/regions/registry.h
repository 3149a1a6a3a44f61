// RegionRegistry: the registered shared-memory regions of one server, by name (one namespace for
// host and device regions), with limits on their number and total bytes, and the lifetime rule
// that makes unregistering safe: a call writing into a region holds a RegionLease; Remove takes
// the name away at once (new calls get NOT_FOUND), tells the lease holders to stop (their
// closing() turns true; the sinks then end their calls with ABORTED at the next chunk), waits
// until every lease is gone and only then unmaps / closes the memory. So the server never
// writes memory it has released, and once Remove returns it never touches the region again.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/regions/region.h"

namespace dequantd::regions {

struct RegistryLimits {
  int max_regions = 64;                   // regions registered at once, >= 0
  int64_t max_bytes = int64_t{64} << 30;  // sum of their byte_size, bytes, >= 0
};

// Totals per kind, reported to the observer after every change.
struct RegionTotals {
  int64_t host_count = 0;
  int64_t host_bytes = 0;
  int64_t device_count = 0;
  int64_t device_bytes = 0;
};

// One region as SharedMemoryStatus lists it.
struct RegionStatus {
  RegionSpec spec;
  RegionKind kind = RegionKind::kHost;
  bool pinned = false;
  int calls_in_flight = 0;
  double idle_seconds = 0;  // since registration or the last lease ended
};

class RegionRegistry;

// A call's hold on a region: the region stays mapped/open while a lease on it lives. Movable;
// not thread-safe itself (one call uses it); closing() may be read while Remove runs.
class RegionLease {
 public:
  RegionLease() = default;
  RegionLease(RegionLease&& other) noexcept;
  RegionLease& operator=(RegionLease&& other) noexcept;
  ~RegionLease();

  Region& region() const;
  // True once the region has been unregistered: stop writing and end the call.
  bool closing() const;

 private:
  friend class RegionRegistry;
  struct Entry;
  RegionLease(RegionRegistry* registry, std::shared_ptr<Entry> entry);
  void Release();

  RegionRegistry* registry_ = nullptr;
  std::shared_ptr<Entry> entry_;
};

// Thread-safe. Must outlive every lease it handed out.
class RegionRegistry {
 public:
  using Clock = std::chrono::steady_clock;
  // `on_change` (may be empty) receives the registered totals after each add/remove, under the
  // registry's lock (so the last call carries the current totals): it must not call back.
  explicit RegionRegistry(RegistryLimits limits,
                          std::function<void(const RegionTotals&)> on_change = nullptr);
  ~RegionRegistry();  // releases every region (no lease may be alive)

  const RegistryLimits& limits() const { return limits_; }

  // Whether a region named `name` of `bytes` could be added now (checked before opening it, and
  // again by Add). Errors: ALREADY_EXISTS (name), RESOURCE_EXHAUSTED (max_regions or max_bytes,
  // with the numbers).
  absl::Status CheckCanAdd(const std::string& name, int64_t bytes) const;
  // Adds an opened region. Errors: CheckCanAdd's (the region is then released).
  absl::Status Add(std::unique_ptr<Region> region);
  // A lease on the region `name`, after Region::CheckUsable. Errors: NOT_FOUND (naming it),
  // CheckUsable's.
  absl::StatusOr<RegionLease> Acquire(const std::string& name);
  // Unregisters `name` (of `kind`; a region of the other kind is NOT_FOUND), waiting for its
  // leases to end. Errors: NOT_FOUND.
  absl::Status Remove(const std::string& name, RegionKind kind);
  // Unregisters every region of `kind` (waiting as Remove); returns how many.
  int RemoveAll(RegionKind kind);
  // Unregisters the regions without a lease whose last use (registration or the end of the last
  // lease) is more than `idle` before `now`; returns their names. The server calls it
  // periodically (--shared-memory-idle-release); tests pass their own `now`.
  std::vector<std::string> ReleaseIdle(Clock::time_point now, Clock::duration idle);
  // Every region, sorted by name.
  std::vector<RegionStatus> List(Clock::time_point now = Clock::now()) const;

 private:
  friend class RegionLease;
  using Entry = RegionLease::Entry;

  // Erases `victims` from the map (under mu_), then waits for their leases and releases them.
  void Retire(std::unique_lock<std::mutex>& lock, std::vector<std::shared_ptr<Entry>> victims);
  void EndLease(Entry& entry);
  RegionTotals TotalsLocked() const;
  void Notify(const RegionTotals& totals) const;  // mu_ held

  const RegistryLimits limits_;
  const std::function<void(const RegionTotals&)> on_change_;
  mutable std::mutex mu_;
  std::condition_variable lease_ended_;
  std::map<std::string, std::shared_ptr<Entry>> regions_;  // guarded by mu_
  int64_t bytes_ = 0;  // byte_size of every region still mapped (retiring ones too); mu_
  int count_ = 0;      // regions still mapped (retiring ones too); guarded by mu_
};

}  // namespace dequantd::regions
