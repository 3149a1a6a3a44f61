// measure/hw_counters.h: the metric names, and UNAVAILABLE (launch never called) without a GPU.
#include "measure/hw_counters.h"

#include <cuda_runtime_api.h>

#include "gtest/gtest.h"

namespace dequantd::bench {
namespace {

TEST(HardwareCountersTest, NamesAreNsightComputeMetrics) {
  const std::vector<std::string> expected = {
      "dram__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_sector_hit_rate.pct",
      "l1tex__t_sector_hit_rate.pct", "dram__bytes_read.sum", "dram__bytes_write.sum"};
  EXPECT_EQ(HardwareCounterNames(), expected);
}

TEST(HardwareCountersTest, UnavailableWithoutDevice) {
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
    GTEST_SKIP() << "a CUDA device is present";
  }
  cudaGetLastError();
  int launches = 0;
  absl::StatusOr<std::map<std::string, double>> counters = MeasureCounters(
      [&launches](cudaStream_t) {
        ++launches;
        return absl::OkStatus();
      },
      nullptr);
  EXPECT_EQ(counters.status().code(), absl::StatusCode::kUnavailable) << counters.status();
  EXPECT_EQ(launches, 0);
}

}  // namespace
}  // namespace dequantd::bench
