// SeriesCache (server/metrics/series_cache.h): the series it returns are the family's own, one
// per combination of label values, named in the constructor's order, and stay right when many
// threads ask at once.
#include "server/metrics/series_cache.h"

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <thread>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace dequantd {
namespace {

TEST(SeriesCacheTest, ReturnsTheFamilysSeriesForTheLabelValuesInOrder) {
  prometheus::Registry registry;
  auto& family = prometheus::BuildCounter().Name("test_total").Help("h").Register(registry);
  SeriesCache<prometheus::Counter, 2> cache(&family, {"method", "code"});
  prometheus::Counter& a = cache.Get({"Dequantize", "OK"});
  EXPECT_EQ(&a, &family.Add({{"method", "Dequantize"}, {"code", "OK"}}));
  EXPECT_EQ(&cache.Get({"Dequantize", "OK"}), &a);
  prometheus::Counter& b = cache.Get({"Dequantize", "NOT_FOUND"});
  EXPECT_NE(&b, &a);
  EXPECT_EQ(&b, &family.Add({{"method", "Dequantize"}, {"code", "NOT_FOUND"}}));
  // The values are not concatenated ambiguously: ("ab", "c") and ("a", "bc") are two series.
  EXPECT_NE(&cache.Get({"ab", "c"}), &cache.Get({"a", "bc"}));
  a.Increment(3);
  const std::vector<prometheus::MetricFamily> collected = registry.Collect();
  ASSERT_EQ(collected.size(), 1u);
  EXPECT_EQ(collected[0].metric.size(), 4u);
  bool found = false;
  for (const prometheus::ClientMetric& m : collected[0].metric) {
    if (m.label.size() == 2 && m.label[0].name == "code" && m.label[0].value == "OK" &&
        m.label[1].name == "method" && m.label[1].value == "Dequantize") {
      EXPECT_EQ(m.counter.value, 3);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(SeriesCacheTest, AdderGivesAHistogramItsBuckets) {
  prometheus::Registry registry;
  auto& family = prometheus::BuildHistogram().Name("test_seconds").Help("h").Register(registry);
  SeriesCache<prometheus::Histogram, 1> cache(
      {"variant"}, [&family](const prometheus::Labels& labels) -> prometheus::Histogram& {
        return family.Add(labels, prometheus::Histogram::BucketBoundaries{0.001, 0.01});
      });
  cache.Get({"v4"}).Observe(0.005);
  cache.Get({"v4"}).Observe(0.5);
  const std::vector<prometheus::MetricFamily> collected = registry.Collect();
  ASSERT_EQ(collected.size(), 1u);
  ASSERT_EQ(collected[0].metric.size(), 1u);
  const prometheus::ClientMetric::Histogram& h = collected[0].metric[0].histogram;
  EXPECT_EQ(h.sample_count, 2u);
  ASSERT_EQ(h.bucket.size(), 3u);  // 0.001, 0.01, +Inf (cumulative)
  EXPECT_EQ(h.bucket[0].cumulative_count, 0u);
  EXPECT_EQ(h.bucket[1].cumulative_count, 1u);
  EXPECT_EQ(h.bucket[2].cumulative_count, 2u);
}

TEST(SeriesCacheTest, ManyThreadsCountEveryIncrementOnOneSeriesPerCombination) {
  prometheus::Registry registry;
  auto& family = prometheus::BuildCounter().Name("test_total").Help("h").Register(registry);
  SeriesCache<prometheus::Counter, 1> cache(&family, {"device"});
  const std::array<std::string, 4> devices = {"cuda:0", "cuda:1", "cuda:2", "cuda:3"};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) cache.Get({devices[(t + i) % 4]}).Increment();
    });
  }
  for (std::thread& thread : threads) thread.join();
  const std::vector<prometheus::MetricFamily> collected = registry.Collect();
  ASSERT_EQ(collected.size(), 1u);
  ASSERT_EQ(collected[0].metric.size(), 4u);
  for (const prometheus::ClientMetric& m : collected[0].metric) {
    EXPECT_EQ(m.counter.value, 8 * 2000 / 4) << m.label[0].value;
  }
}

}  // namespace
}  // namespace dequantd
