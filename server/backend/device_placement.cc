// Device list and layer placement (see device_placement.h).
#include "server/backend/device_placement.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dequantd {

absl::StatusOr<std::vector<int>> ParseDeviceList(absl::string_view spec, int visible) {
  std::vector<int> ordinals;
  if (spec == "all") {
    for (int d = 0; d < visible; ++d) ordinals.push_back(d);
    return ordinals;
  }
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    item = absl::StripAsciiWhitespace(item);
    int ordinal = -1;
    if (item.empty() || !absl::SimpleAtoi(item, &ordinal) || ordinal < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices: \"", spec,
                       "\" is not \"all\" or a comma-separated list of CUDA ordinals (e.g. 0,2)"));
    }
    if (ordinal >= visible) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices: CUDA device ", ordinal, " does not exist (", visible, " visible",
                       visible > 0 ? absl::StrCat(": 0..", visible - 1) : std::string(), ")"));
    }
    ordinals.push_back(ordinal);
  }
  return ordinals;
}

std::vector<std::string> WorkerLabels(absl::Span<const int> ordinals) {
  std::vector<std::string> labels;
  std::map<int, int> seen;
  for (int ordinal : ordinals) {
    const int repeat = seen[ordinal]++;
    labels.push_back(repeat == 0 ? absl::StrCat("cuda:", ordinal)
                                 : absl::StrCat("cuda:", ordinal, ".", repeat));
  }
  return labels;
}

absl::StatusOr<PlacementMode> ParsePlacementMode(absl::string_view name) {
  if (name == "auto") return PlacementMode::kAuto;
  if (name == "replicated") return PlacementMode::kReplicated;
  if (name == "split") return PlacementMode::kSplit;
  return absl::InvalidArgumentError(
      absl::StrCat("--placement: \"", name, "\" is not auto, replicated or split"));
}

absl::string_view PlacementModeName(PlacementMode mode) {
  switch (mode) {
    case PlacementMode::kAuto:
      return "auto";
    case PlacementMode::kReplicated:
      return "replicated";
    case PlacementMode::kSplit:
      return "split";
  }
  return "auto";
}

absl::StatusOr<Placement> PlanPlacement(absl::Span<const int64_t> layer_bytes,
                                        absl::Span<const int64_t> capacity_bytes,
                                        absl::Span<const std::string> labels, PlacementMode mode) {
  const int workers = static_cast<int>(capacity_bytes.size());
  if (workers < 1 || labels.size() != capacity_bytes.size()) {
    return absl::InvalidArgumentError("placement needs one label and capacity per worker (>= 1)");
  }
  const int64_t total = std::accumulate(layer_bytes.begin(), layer_bytes.end(), int64_t{0});
  const bool fits_everywhere = std::all_of(capacity_bytes.begin(), capacity_bytes.end(),
                                           [total](int64_t capacity) { return total <= capacity; });
  Placement placement;
  placement.split = workers > 1 && (mode == PlacementMode::kSplit ||
                                    (mode == PlacementMode::kAuto && !fits_everywhere));
  // The share: which workers are to hold each layer.
  std::vector<std::vector<int>> share(layer_bytes.size());
  if (!placement.split) {
    std::vector<int> all(workers);
    std::iota(all.begin(), all.end(), 0);
    for (std::vector<int>& holders : share) holders = all;
  } else {
    int64_t before = 0;
    for (size_t i = 0; i < layer_bytes.size(); ++i) {
      // The layer's midpoint decides its worker: contiguous runs, each about total / n bytes.
      const double middle = static_cast<double>(before) + static_cast<double>(layer_bytes[i]) / 2;
      const int w = total == 0
                        ? 0
                        : std::min(workers - 1,
                                   static_cast<int>(middle * workers / static_cast<double>(total)));
      share[i] = {w};
      before += layer_bytes[i];
    }
  }
  // The capacity: each worker keeps its share in checkpoint order while it fits.
  placement.worker_bytes.assign(workers, 0);
  placement.holders.resize(layer_bytes.size());
  auto fits = [&](int w, int64_t bytes) {
    return placement.worker_bytes[w] + bytes <= capacity_bytes[w];
  };
  for (size_t i = 0; i < layer_bytes.size(); ++i) {
    for (int w : share[i]) {
      if (!fits(w, layer_bytes[i])) continue;
      placement.holders[i].push_back(w);
      placement.worker_bytes[w] += layer_bytes[i];
    }
  }
  // Split: what its worker could not keep goes to the first other worker with room for it.
  for (size_t i = 0; placement.split && i < layer_bytes.size(); ++i) {
    if (!placement.holders[i].empty()) continue;
    for (int w = 0; w < workers; ++w) {
      if (!fits(w, layer_bytes[i])) continue;
      placement.holders[i].push_back(w);
      placement.worker_bytes[w] += layer_bytes[i];
      break;
    }
  }
  for (size_t i = 0; i < layer_bytes.size(); ++i) {
    if (!placement.holders[i].empty()) continue;
    ++placement.host_layers;
    placement.host_bytes += layer_bytes[i];
  }
  return placement;
}

absl::Status CheckDeviceMemoryLimit(int64_t limit_bytes, int64_t device_memory_bytes,
                                    absl::string_view label, absl::string_view device_name) {
  if (limit_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device-memory-limit must be 0 (no limit) or a number of bytes, got ", limit_bytes));
  }
  if (limit_bytes > device_memory_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device-memory-limit=", limit_bytes, " is more than the memory of ", label,
                     " (", device_name, ": ", device_memory_bytes,
                     " bytes); the limit caps the packed weights each GPU keeps resident"));
  }
  return absl::OkStatus();
}

int64_t WorkerCapacity(int64_t free_bytes, int workers_on_gpu, int64_t reserve_bytes,
                       int64_t limit_bytes) {
  int64_t capacity = free_bytes / std::max(1, workers_on_gpu) - reserve_bytes;
  if (limit_bytes > 0) capacity = std::min(capacity, limit_bytes);
  return std::max<int64_t>(0, capacity);
}

}  // namespace dequantd
