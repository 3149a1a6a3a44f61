// GroupedPlanCache (see grouped_plan_cache.h).
#include "server/backend/cuda/grouped_plan_cache.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace dequantd::cuda {
namespace {

bool SameItem(const GroupedItem& a, const GroupedItem& b) {
  return a.out == b.out && a.in.tensors == b.in.tensors && a.in.shape == b.in.shape;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const GroupedPlan>> GroupedPlanCache::Get(
    absl::Span<const GroupedItem> items, DType out_dtype, const GroupedOptions& options,
    cudaStream_t stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      const GroupedPlan& plan = *it->plan;
      if (plan.out_dtype() != out_dtype || !(plan.options() == options) ||
          !std::equal(items.begin(), items.end(), it->items.begin(), it->items.end(), SameItem)) {
        continue;
      }
      entries_.splice(entries_.begin(), entries_, it);
      return entries_.front().plan;
    }
  }
  // Built outside the lock (the layout and the upload's enqueueing are host work). Two calls
  // missing at once both build and both plans are kept; the one not found first ages out.
  absl::StatusOr<GroupedPlan> built = GroupedPlan::Create(items, out_dtype, options, stream);
  if (!built.ok()) return built.status();
  auto plan = std::make_shared<const GroupedPlan>(*std::move(built));
  std::list<Entry> evicted;  // released after the lock (a table's free is a CUDA call)
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.push_front(Entry{.items = {items.begin(), items.end()}, .plan = plan});
    if (entries_.size() > capacity_) {
      evicted.splice(evicted.begin(), entries_, std::next(entries_.begin(), capacity_),
                     entries_.end());
    }
  }
  return plan;
}

size_t GroupedPlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace dequantd::cuda
