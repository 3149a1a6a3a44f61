// RegionRegistry and RegionLease (see registry.h).
#include "server/regions/registry.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dequantd::regions {

struct RegionLease::Entry {
  std::unique_ptr<Region> region;  // reset only after every lease ended
  int users = 0;                   // leases alive; guarded by the registry's mu_
  std::atomic<bool> closing{false};
  RegionRegistry::Clock::time_point last_used;  // guarded by the registry's mu_
};

// ---- RegionLease ----------------------------------------------------------------------------

RegionLease::RegionLease(RegionRegistry* registry, std::shared_ptr<Entry> entry)
    : registry_(registry), entry_(std::move(entry)) {}

RegionLease::RegionLease(RegionLease&& other) noexcept
    : registry_(std::exchange(other.registry_, nullptr)), entry_(std::move(other.entry_)) {}

RegionLease& RegionLease::operator=(RegionLease&& other) noexcept {
  if (this != &other) {
    Release();
    registry_ = std::exchange(other.registry_, nullptr);
    entry_ = std::move(other.entry_);
  }
  return *this;
}

RegionLease::~RegionLease() { Release(); }

void RegionLease::Release() {
  if (registry_ != nullptr && entry_ != nullptr) registry_->EndLease(*entry_);
  registry_ = nullptr;
  entry_.reset();
}

Region& RegionLease::region() const { return *entry_->region; }

bool RegionLease::closing() const { return entry_->closing.load(std::memory_order_acquire); }

// ---- RegionRegistry -------------------------------------------------------------------------

RegionRegistry::RegionRegistry(RegistryLimits limits,
                               std::function<void(const RegionTotals&)> on_change)
    : limits_(limits), on_change_(std::move(on_change)) {}

RegionRegistry::~RegionRegistry() {
  std::lock_guard<std::mutex> lock(mu_);
  regions_.clear();  // no lease is alive: each Entry (and its mapping) goes here
}

absl::Status RegionRegistry::CheckCanAdd(const std::string& name, int64_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (regions_.contains(name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("name: a region \"", name, "\" is already registered"));
  }
  if (count_ >= limits_.max_regions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "name \"", name, "\": ", count_, " regions are registered, the server's limit (",
        "--shared-memory-max-regions) is ", limits_.max_regions));
  }
  if (bytes > limits_.max_bytes - bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("byte_size ", bytes, " of region \"", name, "\": ", bytes_,
                     " bytes are registered, the server's limit (--shared-memory-max-bytes) is ",
                     limits_.max_bytes));
  }
  return absl::OkStatus();
}

absl::Status RegionRegistry::Add(std::unique_ptr<Region> region) {
  const std::string name = region->spec().name;
  const int64_t bytes = region->spec().byte_size;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // CheckCanAdd's checks again, under the same lock as the insertion (two racing registrations).
    if (regions_.contains(name)) {
      return absl::AlreadyExistsError(
          absl::StrCat("name: a region \"", name, "\" is already registered"));
    }
    if (count_ >= limits_.max_regions || bytes > limits_.max_bytes - bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "region \"", name, "\" (", bytes, " bytes): the server's region limits are reached (",
          count_, " of ", limits_.max_regions, " regions, ", bytes_, " of ", limits_.max_bytes,
          " bytes)"));
    }
    auto entry = std::make_shared<Entry>();
    entry->region = std::move(region);
    entry->last_used = Clock::now();
    regions_.emplace(name, std::move(entry));
    ++count_;
    bytes_ += bytes;
    Notify(TotalsLocked());
  }
  return absl::OkStatus();
}

absl::StatusOr<RegionLease> RegionRegistry::Acquire(const std::string& name) {
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(name);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("output_region.name: no region \"", name,
                                              "\" is registered (see SharedMemoryStatus)"));
    }
    entry = it->second;
    ++entry->users;
  }
  RegionLease lease(this, std::move(entry));
  if (absl::Status s = lease.region().CheckUsable(); !s.ok()) return s;
  return lease;
}

void RegionRegistry::EndLease(Entry& entry) {
  std::lock_guard<std::mutex> lock(mu_);
  --entry.users;
  entry.last_used = Clock::now();
  lease_ended_.notify_all();
}

void RegionRegistry::Retire(std::unique_lock<std::mutex>& lock,
                            std::vector<std::shared_ptr<Entry>> victims) {
  for (const std::shared_ptr<Entry>& entry : victims) {
    entry->closing.store(true, std::memory_order_release);
    regions_.erase(entry->region->spec().name);
  }
  Notify(TotalsLocked());
  for (const std::shared_ptr<Entry>& entry : victims) {
    lease_ended_.wait(lock, [&] { return entry->users == 0; });
    const int64_t bytes = entry->region->spec().byte_size;
    std::unique_ptr<Region> region = std::move(entry->region);
    lock.unlock();
    region.reset();  // unmap / close outside the lock
    lock.lock();
    --count_;
    bytes_ -= bytes;
  }
}

absl::Status RegionRegistry::Remove(const std::string& name, RegionKind kind) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = regions_.find(name);
  if (it == regions_.end() || it->second->region->kind() != kind) {
    return absl::NotFoundError(
        absl::StrCat("name: no ", RegionKindName(kind), " region \"", name, "\" is registered"));
  }
  Retire(lock, {it->second});
  return absl::OkStatus();
}

int RegionRegistry::RemoveAll(RegionKind kind) {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Entry>> victims;
  for (const auto& [name, entry] : regions_) {
    if (entry->region->kind() == kind) victims.push_back(entry);
  }
  const int removed = static_cast<int>(victims.size());
  if (removed > 0) Retire(lock, std::move(victims));
  return removed;
}

std::vector<std::string> RegionRegistry::ReleaseIdle(Clock::time_point now, Clock::duration idle) {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Entry>> victims;
  std::vector<std::string> names;
  for (const auto& [name, entry] : regions_) {
    if (entry->users == 0 && now - entry->last_used > idle) {
      victims.push_back(entry);
      names.push_back(name);
    }
  }
  if (!victims.empty()) Retire(lock, std::move(victims));
  return names;
}

std::vector<RegionStatus> RegionRegistry::List(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RegionStatus> list;
  for (const auto& [name, entry] : regions_) {
    const Region& region = *entry->region;
    list.push_back(RegionStatus{
        .spec = region.spec(),
        .kind = region.kind(),
        .pinned = region.pinned(),
        .calls_in_flight = entry->users,
        .idle_seconds = entry->users > 0
                            ? 0.0
                            : std::chrono::duration<double>(now - entry->last_used).count()});
  }
  return list;
}

RegionTotals RegionRegistry::TotalsLocked() const {
  RegionTotals totals;
  for (const auto& [name, entry] : regions_) {
    const Region& region = *entry->region;
    if (region.kind() == RegionKind::kHost) {
      ++totals.host_count;
      totals.host_bytes += region.spec().byte_size;
    } else {
      ++totals.device_count;
      totals.device_bytes += region.spec().byte_size;
    }
  }
  return totals;
}

void RegionRegistry::Notify(const RegionTotals& totals) const {
  if (on_change_) on_change_(totals);
}

}  // namespace dequantd::regions
