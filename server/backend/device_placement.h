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
  bool split = false;  // false: every worker was to hold every layer (replicated)
  // holders[layer]: the workers (indices into the capacity list) holding layer `layer`
  // (checkpoint order), ascending. Empty: no GPU holds it (it did not fit anywhere); it is
  // served from its host copy, staged to a GPU per call (docs/architecture.md "Models larger
  // than the GPU").
  std::vector<std::vector<int>> holders;
  std::vector<int64_t> worker_bytes;  // packed bytes each worker holds
  int64_t host_layers = 0;            // layers no worker holds
  int64_t host_bytes = 0;             // their packed bytes
};

// Places layers of `layer_bytes` (packed bytes each, checkpoint order) on workers with
// `capacity_bytes` usable device memory each (>= 1 worker, each >= 0).
// First the share: replicated, every layer on every worker; split, layers stay in checkpoint
// order and are cut into contiguous runs balanced by bytes: layer i goes to worker
// floor(n * (bytes before i + half of layer i) / total bytes), so worker w's share is about
// total / n bytes (one layer at most off the ideal cut). With one worker, split is replicated.
// Then the capacity: each worker keeps the layers of its share in checkpoint order while they fit
// (a layer that does not fit is skipped, and later, smaller ones may still fit), so it holds at
// most its capacity. Split only: a layer its worker could not keep goes to the first other worker
// (in worker order) with room left for it. A layer that no worker keeps is host-only (holders
// empty; counted in host_layers / host_bytes): a capacity below every layer leaves every layer on
// the host. Never fails on capacity; INVALID_ARGUMENT when labels and capacities disagree or there
// is no worker.
absl::StatusOr<Placement> PlanPlacement(absl::Span<const int64_t> layer_bytes,
                                        absl::Span<const int64_t> capacity_bytes,
                                        absl::Span<const std::string> labels, PlacementMode mode);

// --device-memory-limit (docs/architecture.md "Models larger than the GPU"): the packed bytes a
// worker may keep resident; 0 = no limit (what fits in free memory beside the reserve). OK for 0
// and for 1 .. `device_memory_bytes` (the device's total memory, cudaDeviceProp::totalGlobalMem);
// INVALID_ARGUMENT naming --device-memory-limit, the worker `label`, `device_name` and its
// memory for a limit above it, and for a negative limit.
absl::Status CheckDeviceMemoryLimit(int64_t limit_bytes, int64_t device_memory_bytes,
                                    absl::string_view label, absl::string_view device_name);

// The packed bytes worker may hold: min(`free_bytes` / `workers_on_gpu` - `reserve_bytes`,
// `limit_bytes` when > 0), at least 0. `workers_on_gpu` >= 1 (workers sharing one GPU share its
// free memory equally).
int64_t WorkerCapacity(int64_t free_bytes, int workers_on_gpu, int64_t reserve_bytes,
                       int64_t limit_bytes);

}  // namespace dequantd
