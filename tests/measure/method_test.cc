#include "measure/method.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace dequantd::bench {
namespace {

// Returns latencies from a fixed cycle and a fixed throughput; counts calls.
class FakeRunner : public Runner {
 public:
  FakeRunner(std::string name, int64_t bytes, std::vector<double> cycle, double throughput,
             bool correct)
      : Runner(std::move(name), bytes, "fake"),
        cycle_(std::move(cycle)),
        throughput_(throughput),
        correct_(correct) {}

  absl::StatusOr<double> LatencySeconds() override {
    return cycle_[latency_calls_++ % cycle_.size()];
  }
  absl::StatusOr<double> ThroughputSeconds() override {
    ++throughput_calls_;
    return throughput_;
  }
  absl::StatusOr<bool> CheckOutput(const OutputChecker&, const std::vector<RowRange>&) override {
    ++check_calls_;
    return correct_;
  }

  size_t latency_calls_ = 0;
  int throughput_calls_ = 0;
  int check_calls_ = 0;

 private:
  std::vector<double> cycle_;
  double throughput_;
  bool correct_;
};

class FailingRunner : public FakeRunner {
 public:
  FailingRunner() : FakeRunner("failing", 1, {1}, 0, true) {}
  absl::StatusOr<double> ThroughputSeconds() override {
    return absl::InternalError("cudaGraphLaunch failed");
  }
};

// A (K, N) layer, G = 128, fp16 scales of 1 and zero weights, and its output checker. Not
// movable: the view and the checker point into the vectors.
struct TestLayer {
  TestLayer(int64_t K, int64_t N)
      : shape{K, N, 128, DType::kF16},
        qweight(K * N / 8),
        qzeros(K / 128 * N / 8),
        scales(K / 128 * N, 0x3C00),
        view{shape, qweight.data(), qzeros.data(), scales.data()},
        checker(OutputChecker::Create(view, DType::kF16, 1 << 20)) {}
  TestLayer(const TestLayer&) = delete;
  TestLayer& operator=(const TestLayer&) = delete;

  QuantShape shape;
  std::vector<int32_t> qweight, qzeros;
  std::vector<uint16_t> scales;
  QuantView view;
  absl::StatusOr<OutputChecker> checker;
};

TEST(RunMethodTest, RowsCarryStatsRatesAndChecks) {
  const TestLayer layer(256, 64);
  ASSERT_TRUE(layer.checker.ok());
  const QuantShape& shape = layer.shape;
  const OutputChecker& checker = *layer.checker;

  // Warm-up takes the first 3 values of the cycle; the 2 x 3 timed runs then see
  // {4, 5, 1, 2, 3, 4} x 1e-6: median 3.5e-6, mean 3.1667e-6.
  FakeRunner good("good", 1000, {1e-6, 2e-6, 3e-6, 4e-6, 5e-6}, 2e-6, true);
  FakeRunner bad("bad", 2000, {1e-3}, 0, false);
  MethodOptions options;
  options.trials = 2;
  options.runs = 3;
  options.warmup_runs = 3;
  options.peak_copy_bytes_per_second = 1e9;
  std::mt19937_64 rng(1);
  absl::StatusOr<std::vector<BenchmarkRow>> rows =
      RunMethod({&good, &bad}, shape, DType::kBF16, checker, options, rng);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);

  const BenchmarkRow& g = (*rows)[0];
  EXPECT_EQ(g.variant, "good");
  EXPECT_EQ(g.K, 256);
  EXPECT_EQ(g.N, 64);
  EXPECT_EQ(g.group_size, 128);
  EXPECT_EQ(g.output_dtype, DType::kBF16);
  EXPECT_EQ(g.bytes_moved, 1000);
  EXPECT_EQ(g.launch_config, "fake");
  EXPECT_EQ(g.latency.count, 6);
  EXPECT_DOUBLE_EQ(g.latency.median, 3.5e-6);
  EXPECT_DOUBLE_EQ(g.latency.mean, 19e-6 / 6);
  EXPECT_DOUBLE_EQ(g.latency.min, 1e-6);
  EXPECT_DOUBLE_EQ(g.latency.max, 5e-6);
  EXPECT_DOUBLE_EQ(g.bytes_per_second, 1000 / 3.5e-6);
  EXPECT_DOUBLE_EQ(g.fraction_of_peak, 1000 / 3.5e-6 / 1e9);
  EXPECT_DOUBLE_EQ(g.throughput_seconds, 2e-6);
  EXPECT_DOUBLE_EQ(g.throughput_bytes_per_second, 5e8);
  EXPECT_DOUBLE_EQ(g.throughput_fraction_of_peak, 0.5);
  EXPECT_TRUE(g.correct);

  const BenchmarkRow& b = (*rows)[1];
  EXPECT_EQ(b.variant, "bad");
  EXPECT_FALSE(b.correct);
  EXPECT_EQ(b.throughput_seconds, 0);  // not measured
  EXPECT_EQ(b.throughput_fraction_of_peak, 0);
  EXPECT_DOUBLE_EQ(b.bytes_per_second, 2e6);

  EXPECT_EQ(good.latency_calls_, 3u + 2 * 3);
  EXPECT_EQ(good.throughput_calls_, 2);
  EXPECT_EQ(good.check_calls_, 2);
  EXPECT_EQ(bad.check_calls_, 2);
}

TEST(RunMethodTest, RunnerErrorsPropagate) {
  const TestLayer layer(128, 8);
  ASSERT_TRUE(layer.checker.ok());
  const QuantShape& shape = layer.shape;
  const OutputChecker& checker = *layer.checker;
  FailingRunner failing;
  std::mt19937_64 rng(1);
  absl::StatusOr<std::vector<BenchmarkRow>> rows =
      RunMethod({&failing}, shape, DType::kF16, checker, MethodOptions{}, rng);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kInternal);
}

TEST(RunMethodTest, CancelledStopsBeforeTheNextCall) {
  const TestLayer layer(128, 8);
  ASSERT_TRUE(layer.checker.ok());
  const QuantShape& shape = layer.shape;
  const OutputChecker& checker = *layer.checker;
  FakeRunner a("a", 1, {1e-6}, 1e-6, true), b("b", 1, {1e-6}, 1e-6, true);
  MethodOptions options;
  options.trials = 5;
  options.runs = 10;
  options.warmup_runs = 3;
  // Fires once 8 latency calls were made: the 6 warm-up calls and 2 timed ones (the first run).
  options.cancelled = [&] { return a.latency_calls_ + b.latency_calls_ >= 8; };
  std::mt19937_64 rng(1);
  absl::StatusOr<std::vector<BenchmarkRow>> rows =
      RunMethod({&a, &b}, shape, DType::kF16, checker, options, rng);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(rows.status().message(), "benchmark cancelled");
  EXPECT_EQ(a.latency_calls_ + b.latency_calls_, 8u);
  EXPECT_EQ(a.throughput_calls_ + b.throughput_calls_, 0);
  EXPECT_EQ(a.check_calls_ + b.check_calls_, 0);
}

TEST(CopyBytesForTest, HalfRoundedDownToSixteen) {
  EXPECT_EQ(CopyBytesFor(330240), 165120);
  EXPECT_EQ(CopyBytesFor(100), 48);
}

}  // namespace
}  // namespace dequantd::bench
