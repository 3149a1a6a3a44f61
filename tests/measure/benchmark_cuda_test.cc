// The benchmark's CUDA backend on a real device (skipped without one): every kernel variant's
// rows are correct and carry both timings; hardware counters (where the driver allows profiling)
// count what the kernel must move.
#include <cuda_runtime_api.h>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/dequant.h"
#include "measure/backends.h"
#include "measure/benchmark.h"

namespace dequantd::bench {
namespace {

TEST(CudaBenchmarkTest, SmallShapesAllVariantsAndDtypes) {
  if (!CudaDeviceAvailable(0)) GTEST_SKIP() << "no CUDA device";
  BenchmarkRequest r;
  r.backend = Backend::kCuda;
  r.shapes = {{256, 512}, {1536, 8960}};
  r.output_dtypes = {DType::kF16, DType::kBF16, DType::kF32};
  r.trials = 2;
  r.runs = 3;
  r.seed = 7;
  r.peak_copy_bytes = 256 << 20;
  r.full_check_max_elements = 1 << 20;  // the larger shape is checked on sampled rows
  absl::StatusOr<BenchmarkResult> result = RunBenchmark(r);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->backend, "cuda");
  EXPECT_GT(result->peak_copy_bytes_per_second, 0);
  ASSERT_FALSE(result->rows.empty());
  ASSERT_EQ(result->rows.size() % 6, 0u);  // 2 shapes x 3 dtypes x (variants + copy)
  for (const BenchmarkRow& row : result->rows) {
    SCOPED_TRACE(row.variant + " " + std::to_string(row.K) + "x" + std::to_string(row.N) + " " +
                 std::string(DTypeName(row.output_dtype)));
    EXPECT_TRUE(row.correct);
    EXPECT_EQ(row.latency.count, 6);
    EXPECT_GT(row.latency.median, 0);
    EXPECT_GT(row.throughput_seconds, 0);
    EXPECT_GT(row.fraction_of_peak, 0);
    EXPECT_FALSE(row.launch_config.empty());
    if (row.variant != "copy") {
      EXPECT_EQ(row.bytes_moved,
                (QuantShape{row.K, row.N, 128, DType::kF16}).bytes_moved(row.output_dtype));
    }
  }
}

// With the L2 flushed before each pass, the kernel reads every input byte from DRAM once, and
// writes back all of its output except what is still dirty in L2 when it ends (at most the L2's
// size): on 4096x14336 the 29.4 MB of inputs and 117 MB of fp16 output are both larger than L2.
TEST(CudaBenchmarkTest, HardwareCountersCountTheKernelsOwnTraffic) {
  if (!CudaDeviceAvailable(0)) GTEST_SKIP() << "no CUDA device";
  BenchmarkRequest r;
  r.backend = Backend::kCuda;
  r.shapes = {{4096, 14336}};
  r.output_dtypes = {DType::kF16};
  r.variants = {"v4_vec16"};
  r.trials = 1;
  r.runs = 2;
  r.peak_copy_bytes = 64 << 20;
  r.hardware_counters = true;
  absl::StatusOr<BenchmarkResult> result = RunBenchmark(r);
  ASSERT_TRUE(result.ok()) << result.status();
  if (absl::StrContains(result->note, "hardware counters unavailable")) {
    GTEST_SKIP() << result->note;  // e.g. the driver forbids profiling to this user
  }
  int l2 = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0), cudaSuccess);
  const QuantShape shape{4096, 14336, 128, DType::kF16};
  const double out = static_cast<double>(shape.output_bytes(DType::kF16));
  const double in = static_cast<double>(shape.bytes_moved(DType::kF16)) - out;
  ASSERT_FALSE(result->rows.empty());
  const BenchmarkRow& row = result->rows.front();
  ASSERT_EQ(row.variant, "v4_vec16");
  ASSERT_EQ(row.counters.size(), 5u);
  EXPECT_GT(row.counters.at("dram__bytes_read.sum"), 0.98 * in);
  EXPECT_LT(row.counters.at("dram__bytes_read.sum"), 1.05 * in);
  EXPECT_GT(row.counters.at("dram__bytes_write.sum"), out - l2);
  EXPECT_LT(row.counters.at("dram__bytes_write.sum"), 1.01 * out);
  for (const char* pct : {"dram__throughput.avg.pct_of_peak_sustained_elapsed",
                          "lts__t_sector_hit_rate.pct", "l1tex__t_sector_hit_rate.pct"}) {
    EXPECT_GE(row.counters.at(pct), 0) << pct;
    EXPECT_LE(row.counters.at(pct), 100) << pct;
  }
  EXPECT_GT(row.counters.at("dram__throughput.avg.pct_of_peak_sustained_elapsed"), 10);
  EXPECT_TRUE(row.correct);
}

}  // namespace
}  // namespace dequantd::bench
