// Worker load, rotation and layer parts (see device_router.h).
#include "server/backend/device_router.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dequantd {

DeviceRouter::DeviceRouter(std::vector<std::string> labels, LoadListener on_load,
                           FailureListener on_failed)
    : labels_(std::move(labels)),
      on_load_(std::move(on_load)),
      on_failed_(std::move(on_failed)),
      in_flight_(labels_.size(), 0),
      failures_(labels_.size()) {}

DeviceRouter::Ticket::Ticket(Ticket&& other) noexcept
    : router_(std::exchange(other.router_, nullptr)), worker_(other.worker_) {}

DeviceRouter::Ticket::~Ticket() {
  if (router_ != nullptr) router_->Release(worker_);
}

absl::StatusOr<DeviceRouter::Ticket> DeviceRouter::AcquireLeastLoaded(
    absl::Span<const int> candidates) {
  int chosen = -1;
  int64_t load = 0;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t n = candidates.size();
    const size_t start = n == 0 ? 0 : static_cast<size_t>(next_++ % n);
    for (size_t j = 0; j < n; ++j) {
      const int w = candidates[(start + j) % n];
      const size_t i = static_cast<size_t>(w);
      if (!failures_[i].empty()) {
        absl::StrAppend(&why, why.empty() ? "" : "; ", labels_[i], ": ", failures_[i]);
        continue;
      }
      if (chosen < 0 || in_flight_[i] < in_flight_[static_cast<size_t>(chosen)]) chosen = w;
    }
    if (chosen >= 0) load = ++in_flight_[static_cast<size_t>(chosen)];
  }
  if (chosen < 0) {
    return absl::UnavailableError(
        candidates.empty()
            ? std::string("no CUDA worker holds what this call needs")
            : absl::StrCat("every CUDA device that could serve this call is out of rotation (", why,
                           ")"));
  }
  Changed(chosen, load);
  return Ticket(this, chosen);
}

DeviceRouter::Ticket DeviceRouter::Acquire(int worker) {
  int64_t load = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    load = ++in_flight_[static_cast<size_t>(worker)];
  }
  Changed(worker, load);
  return Ticket(this, worker);
}

void DeviceRouter::Release(int worker) {
  int64_t load = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    load = --in_flight_[static_cast<size_t>(worker)];
  }
  Changed(worker, load);
}

void DeviceRouter::Changed(int worker, int64_t in_flight) const {
  if (on_load_) on_load_(worker, in_flight);
}

bool DeviceRouter::MarkFailed(int worker, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::string& failure = failures_[static_cast<size_t>(worker)];
    if (!failure.empty()) return false;
    failure = reason.empty() ? "failed" : reason;
  }
  if (on_failed_) on_failed_(worker, reason);
  return true;
}

bool DeviceRouter::serving(int worker) const {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_[static_cast<size_t>(worker)].empty();
}

std::string DeviceRouter::failure(int worker) const {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_[static_cast<size_t>(worker)];
}

int64_t DeviceRouter::in_flight(int worker) const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_[static_cast<size_t>(worker)];
}

std::vector<int64_t> DeviceRouter::loads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

absl::StatusOr<std::vector<LayerPart>> PlanLayerParts(absl::Span<const std::vector<int>> candidates,
                                                      absl::Span<const int64_t> result_bytes,
                                                      absl::Span<const int64_t> loads,
                                                      int64_t min_part_bytes) {
  if (candidates.size() != result_bytes.size() || min_part_bytes < 1) {
    return absl::InvalidArgumentError("PlanLayerParts: one candidate list and size per entry");
  }
  std::vector<int64_t> load(loads.begin(), loads.end());
  std::vector<LayerPart> parts;
  auto add = [&parts](size_t begin, size_t end, int worker) {
    if (!parts.empty() && parts.back().worker == worker && parts.back().end == begin) {
      parts.back().end = end;
    } else {
      parts.push_back(LayerPart{.begin = begin, .end = end, .worker = worker});
    }
  };
  for (size_t run_begin = 0; run_begin < candidates.size();) {
    if (candidates[run_begin].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("entry ", run_begin, " has no worker"));
    }
    size_t run_end = run_begin + 1;
    while (run_end < candidates.size() && candidates[run_end] == candidates[run_begin]) ++run_end;
    std::vector<int> order = candidates[run_begin];
    for (int w : order) {
      if (w < 0 || static_cast<size_t>(w) >= load.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("entry ", run_begin, ": unknown worker ", w));
      }
    }
    std::stable_sort(order.begin(), order.end(), [&load](int a, int b) {
      return load[static_cast<size_t>(a)] < load[static_cast<size_t>(b)];
    });
    const int64_t bytes =
        std::accumulate(result_bytes.begin() + static_cast<std::ptrdiff_t>(run_begin),
                        result_bytes.begin() + static_cast<std::ptrdiff_t>(run_end), int64_t{0});
    const int64_t m =
        std::clamp<int64_t>(bytes / min_part_bytes, 1, static_cast<int64_t>(order.size()));
    int64_t before = 0;
    size_t part_begin = run_begin;
    int64_t part = 0;
    for (size_t i = run_begin; i < run_end; ++i) {
      const double middle = static_cast<double>(before) + static_cast<double>(result_bytes[i]) / 2;
      const int64_t p =
          bytes == 0
              ? 0
              : std::min<int64_t>(m - 1, static_cast<int64_t>(middle * static_cast<double>(m) /
                                                              static_cast<double>(bytes)));
      if (p != part) {
        // The run's first entry may already fall past part 0 (one entry larger than a part):
        // no empty part before it (its worker would run nothing, not even the call's Begin).
        if (i > part_begin) add(part_begin, i, order[static_cast<size_t>(part)]);
        part_begin = i;
        part = p;
      }
      before += result_bytes[i];
    }
    add(part_begin, run_end, order[static_cast<size_t>(part)]);
    for (int64_t j = 0; j < m; ++j) ++load[static_cast<size_t>(order[static_cast<size_t>(j)])];
    run_begin = run_end;
  }
  return parts;
}

}  // namespace dequantd
