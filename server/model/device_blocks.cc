// PlanDeviceBlocks (see device_blocks.h).
#include "server/model/device_blocks.h"

#include <cstddef>

namespace dequantd {

DeviceBlockPlan PlanDeviceBlocks(const std::vector<int64_t>& sizes, int64_t block_bytes,
                                 int64_t align) {
  DeviceBlockPlan plan;
  plan.block.assign(sizes.size(), -1);
  plan.offset.assign(sizes.size(), 0);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] <= 0) continue;
    int64_t at = 0;
    if (!plan.block_bytes.empty()) {
      at = (plan.block_bytes.back() + align - 1) / align * align;
    }
    if (plan.block_bytes.empty() || at + sizes[i] > block_bytes) {  // a new block
      plan.block_bytes.push_back(0);
      at = 0;
    }
    plan.block[i] = static_cast<int>(plan.block_bytes.size()) - 1;
    plan.offset[i] = at;
    plan.block_bytes.back() = at + sizes[i];
  }
  return plan;
}

}  // namespace dequantd
