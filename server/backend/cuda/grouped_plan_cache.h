// Grouped launch plans (kernels/cuda/grouped_dequant.h) kept for launches that repeat exactly:
// the same layers written to the same addresses, e.g. a whole model dequantized again and again
// into a client's device region. A hit costs a compare of the items and one kernel launch; a
// miss builds the plan (layout, an asynchronous table upload: the host never waits) and keeps
// it, so a pattern of more distinct calls than the capacity costs what a one-shot plan would.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cuda/grouped_dequant.h"

namespace dequantd::cuda {

// Thread-safe. Keeps the `capacity` most recently used plans of one device (each holds a table
// of ~128 bytes per layer in device memory, so at most capacity x ~1.3 MB for 10,000 layers).
class GroupedPlanCache {
 public:
  explicit GroupedPlanCache(size_t capacity) : capacity_(capacity) {}

  // The plan computing `items` (device pointers, as GroupedItem says) with `out_dtype` and
  // `options`: a kept one when an earlier call had exactly these items (pointers and shapes),
  // else one built now on the current device through `stream` (GroupedPlan::Create; launches on
  // other streams wait for its upload) and kept, the least recently used one giving way. The
  // caller holds the plan until every stream it launched the plan on has been synchronized (a
  // plan's table is freed, without synchronizing, when its last holder lets go). Errors:
  // GroupedPlan::Create's.
  absl::StatusOr<std::shared_ptr<const GroupedPlan>> Get(absl::Span<const GroupedItem> items,
                                                         DType out_dtype,
                                                         const GroupedOptions& options,
                                                         cudaStream_t stream);

  size_t size() const;  // plans kept

 private:
  struct Entry {
    std::vector<GroupedItem> items;
    std::shared_ptr<const GroupedPlan> plan;  // knows its dtype and options
  };
  const size_t capacity_;
  mutable std::mutex mu_;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace dequantd::cuda
