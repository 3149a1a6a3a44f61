// MeasureCounters for builds without CUPTI (measure/hw_counters.h).
#include "measure/hw_counters.h"

namespace dequantd::bench {

absl::StatusOr<std::map<std::string, double>> MeasureCounters(
    const std::function<absl::Status(cudaStream_t)>&, cudaStream_t) {
  return absl::UnavailableError("this build has no CUPTI (DEQUANTD_CUPTI)");
}

}  // namespace dequantd::bench
