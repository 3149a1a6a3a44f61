// Reading one series back from a Metrics registry (server/metrics/metrics.h) in tests: what
// /metrics would serialize for it. Shared by tests/observability and tests/server.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "server/metrics/metrics.h"

namespace dequantd::testing {

using Labels = std::map<std::string, std::string>;

// One collected series: its value (counter, gauge or histogram sample count) and, for histograms,
// the sum.
struct Series {
  prometheus::MetricType type;
  double value = 0;
  double sum = 0;
};

// The series of family `name` whose labels are exactly `labels`, or nullopt.
inline std::optional<Series> FindSeries(const Metrics& metrics, const std::string& name,
                                        const Labels& labels = {}) {
  for (const prometheus::MetricFamily& family : metrics.registry()->Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      Labels have;
      for (const auto& label : metric.label) have[label.name] = label.value;
      if (have != labels) continue;
      switch (family.type) {
        case prometheus::MetricType::Counter:
          return Series{family.type, metric.counter.value, 0};
        case prometheus::MetricType::Gauge:
          return Series{family.type, metric.gauge.value, 0};
        case prometheus::MetricType::Histogram:
          return Series{family.type, static_cast<double>(metric.histogram.sample_count),
                        metric.histogram.sample_sum};
        default:
          return Series{family.type, 0, 0};
      }
    }
  }
  return std::nullopt;
}

// FindSeries(...)->value, or nullopt.
inline std::optional<double> SeriesValue(const Metrics& metrics, const std::string& name,
                                         const Labels& labels = {}) {
  std::optional<Series> s = FindSeries(metrics, name, labels);
  return s ? std::optional<double>(s->value) : std::nullopt;
}

}  // namespace dequantd::testing
