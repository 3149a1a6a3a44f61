#include "measure/stats.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace dequantd::bench {
namespace {

TEST(ComputeStatsTest, OddCountWithOutlier) {
  const std::vector<double> x = {3, 100, 1, 4, 2};
  const SampleStats s = ComputeStats(x);
  EXPECT_EQ(s.count, 5);
  EXPECT_EQ(s.median, 3);
  EXPECT_EQ(s.mean, 22);
  // Deviations 21, 20, 19, 18, 78: squares sum to 7610; 7610 / 5 = 1522.
  EXPECT_DOUBLE_EQ(s.std, std::sqrt(1522.0));
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 100);
  EXPECT_TRUE(s.divergent);  // |22 - 3| > 0.45
}

TEST(ComputeStatsTest, EvenCountAveragesTheMiddlePair) {
  const std::vector<double> x = {4, 1, 3, 2};
  const SampleStats s = ComputeStats(x);
  EXPECT_EQ(s.median, 2.5);
  EXPECT_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.std, std::sqrt(1.25));  // (2.25 + 0.25 + 0.25 + 2.25) / 4
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 4);
  EXPECT_FALSE(s.divergent);
}

TEST(ComputeStatsTest, DivergentThresholdIsFifteenPercentOfMedian) {
  // Median 10; means 11.4667 (14.7% above) and 11.5333 (15.3% above).
  EXPECT_FALSE(ComputeStats(std::vector<double>{10, 10, 14.4}).divergent);
  EXPECT_TRUE(ComputeStats(std::vector<double>{10, 10, 14.6}).divergent);
  // Below the median counts too: median 10, mean 8.3333.
  EXPECT_TRUE(ComputeStats(std::vector<double>{5, 10, 10}).divergent);
}

TEST(ComputeStatsTest, SingleAndEmpty) {
  const SampleStats one = ComputeStats(std::vector<double>{7e-6});
  EXPECT_EQ(one.count, 1);
  EXPECT_EQ(one.median, 7e-6);
  EXPECT_EQ(one.mean, 7e-6);
  EXPECT_EQ(one.std, 0);
  EXPECT_FALSE(one.divergent);
  const SampleStats none = ComputeStats(std::vector<double>{});
  EXPECT_EQ(none.count, 0);
  EXPECT_EQ(none.median, 0);
  EXPECT_FALSE(none.divergent);
}

}  // namespace
}  // namespace dequantd::bench
