// Which GPUs serve (--devices) and which layers of the model each one holds (--placement). No
// CUDA here, so the rules are tested on the CPU (tests/server/device_placement_test.cc); the CUDA
// backend feeds them the device count and each GPU's free memory. docs/architecture.md "Several
// GPUs" explains the rules.
#pragma once

#include <cstdint>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dequantd {

// The CUDA ordinals that serve, in order, from --devices: "all" (0 .. visible - 1) or a comma list
// such as "0,2". An ordinal may repeat ("0,0"): each entry is one worker (its own slots, resident
// copy and metrics), so one GPU can stand in for several when testing routing and failure.
// INVALID_ARGUMENT naming --devices for an empty list, an entry that is not a number, or an
// ordinal outside 0 .. visible - 1 (the message says how many GPUs are visible).
absl::StatusOr<std::vector<int>> ParseDeviceList(absl::string_view spec, int visible);

// Each worker's `device` label (metrics, GetServerInfo, failure injection): "cuda:<ordinal>" for
// the first worker of an ordinal, "cuda:<ordinal>.<k>" for its k-th repeat (k >= 1).
std::vector<std::string> WorkerLabels(absl::Span<const int> ordinals);

enum class PlacementMode {
  kAuto,        // replicated when the packed model fits every worker, else split
  kReplicated,  // the whole packed model on every worker (RESOURCE_EXHAUSTED when it does not fit)
  kSplit,       // layers split across the workers even when the model would fit on one
};

// "auto", "replicated" or "split"; INVALID_ARGUMENT naming --placement otherwise.
absl::StatusOr<PlacementMode> ParsePlacementMode(absl::string_view name);
absl::string_view PlacementModeName(PlacementMode mode);

// Which workers hold which layers.
struct Placement {
  bool split = false;  // false: every worker holds every layer
  // holders[layer]: the workers (indices into the capacity list) holding layer `layer`
  // (checkpoint order), ascending.
  std::vector<std::vector<int>> holders;
  std::vector<int64_t> worker_bytes;  // packed bytes each worker holds
};

// Places layers of `layer_bytes` (packed bytes each, checkpoint order) on workers with
// `capacity_bytes` usable device memory each (>= 1 worker).
// Replicated: every layer on every worker. Split: layers stay in checkpoint order and are cut into
// contiguous runs balanced by bytes: layer i goes to worker floor(n * (bytes before i + half of
// layer i) / total bytes), so worker w holds about total / n bytes (one layer at most off the
// ideal cut). With one worker, split is replicated.
// Errors: RESOURCE_EXHAUSTED naming the worker, its share and its capacity when a worker's share
// does not fit (kReplicated: the whole model; split: its run).
absl::StatusOr<Placement> PlanPlacement(absl::Span<const int64_t> layer_bytes,
                                        absl::Span<const int64_t> capacity_bytes,
                                        absl::Span<const std::string> labels, PlacementMode mode);

}  // namespace dequantd
