// Routing of calls among the CUDA backend's workers (one per --devices entry): how loaded each
// is, which are in rotation, which one a call goes to, and how one DequantizeLayers call is cut
// into parts for several workers. No CUDA here, so it is tested on the CPU
// (tests/server/device_router_test.cc). docs/architecture.md "Several GPUs" gives the rules.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dequantd {

// Thread-safe. Workers are indices 0 .. labels.size() - 1.
class DeviceRouter {
 public:
  // Called (outside the router's lock) when a worker's load changes: its calls in flight.
  using LoadListener = std::function<void(int worker, int64_t in_flight)>;
  // Called once per worker taken out of rotation, with the reason (outside the lock).
  using FailureListener = std::function<void(int worker, const std::string& reason)>;

  DeviceRouter(std::vector<std::string> labels, LoadListener on_load, FailureListener on_failed);
  DeviceRouter(const DeviceRouter&) = delete;
  DeviceRouter& operator=(const DeviceRouter&) = delete;

  // One call's claim on a worker: counted in its load until destroyed.
  class Ticket {
   public:
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&&) = delete;
    ~Ticket();
    int worker() const { return worker_; }

   private:
    friend class DeviceRouter;
    Ticket(DeviceRouter* router, int worker) : router_(router), worker_(worker) {}
    DeviceRouter* router_;
    int worker_;
  };

  // Claims the least-loaded worker in rotation among `candidates` (load = calls holding a
  // ticket: running in a slot or waiting for one); ties go round robin. UNAVAILABLE when none of
  // them is in rotation (the message names each and why it was taken out; "no worker" when
  // `candidates` is empty).
  absl::StatusOr<Ticket> AcquireLeastLoaded(absl::Span<const int> candidates);
  // Claims `worker` whatever its load (it was chosen by PlanLayerParts).
  Ticket Acquire(int worker);

  // Takes `worker` out of rotation with `reason`. True the first time (the listener ran).
  bool MarkFailed(int worker, const std::string& reason);

  int size() const { return static_cast<int>(labels_.size()); }
  const std::string& label(int worker) const { return labels_[static_cast<size_t>(worker)]; }
  bool serving(int worker) const;
  std::string failure(int worker) const;  // empty while serving
  int64_t in_flight(int worker) const;
  std::vector<int64_t> loads() const;  // in_flight of every worker, a snapshot

 private:
  void Release(int worker);
  void Changed(int worker, int64_t in_flight) const;

  const std::vector<std::string> labels_;
  const LoadListener on_load_;
  const FailureListener on_failed_;
  mutable std::mutex mu_;
  std::vector<int64_t> in_flight_;     // guarded by mu_
  std::vector<std::string> failures_;  // guarded by mu_; non-empty: out of rotation
  uint64_t next_ = 0;                  // guarded by mu_; round-robin start for ties
};

// One part of a DequantizeLayers call: request entries [begin, end) run on `worker`.
struct LayerPart {
  size_t begin = 0;
  size_t end = 0;
  int worker = 0;
};

// Cuts a DequantizeLayers call into contiguous parts, one worker each, in request order.
// `candidates[i]`: the workers in rotation that may compute entry i (holders of its layer, on the
// destination's device when there is one). `result_bytes[i]`: entry i's result size. `loads`:
// every worker's in-flight calls (DeviceRouter::loads). Entries with the same candidates form a
// run; a run of B bytes is split into m = clamp(B / min_part_bytes, 1, its candidate count)
// parts balanced by bytes (entry i goes to part floor(m * (bytes before i + half of i) / B)),
// given to its least-loaded candidates first (ties: lower index); adjacent parts on one worker
// merge. So a small call stays on one worker, and a replicated model's whole-model call is
// spread over every GPU. INVALID_ARGUMENT when an entry has no candidate or the spans differ in
// size; min_part_bytes >= 1.
absl::StatusOr<std::vector<LayerPart>> PlanLayerParts(absl::Span<const std::vector<int>> candidates,
                                                      absl::Span<const int64_t> result_bytes,
                                                      absl::Span<const int64_t> loads,
                                                      int64_t min_part_bytes);

}  // namespace dequantd
