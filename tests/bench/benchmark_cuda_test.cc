// The benchmark's CUDA backend on a real device (skipped without one): every kernel variant's
// rows are correct and carry both timings.
#include "bench/backends.h"
#include "bench/benchmark.h"
#include "gtest/gtest.h"
#include "kernels/dequant.h"

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
                (AwqShape{row.K, row.N, 128, DType::kF16}).bytes_moved(row.output_dtype));
    }
  }
}

}  // namespace
}  // namespace dequantd::bench
