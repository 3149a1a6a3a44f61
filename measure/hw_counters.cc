// The metric names of measure/hw_counters.h, shared by the CUPTI and stub implementations.
#include "measure/hw_counters.h"

namespace dequantd::bench {

const std::vector<std::string>& HardwareCounterNames() {
  static const std::vector<std::string> names = {
      "dram__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_sector_hit_rate.pct",
      "l1tex__t_sector_hit_rate.pct", "dram__bytes_read.sum", "dram__bytes_write.sum"};
  return names;
}

}  // namespace dequantd::bench
