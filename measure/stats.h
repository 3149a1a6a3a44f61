// Summary statistics of timing samples, as the benchmark reports them (issue 3, part 1).
#pragma once

#include <span>

namespace dequantd::bench {

// The divergence threshold: a row is flagged when |mean - median| > kDivergentFraction * median.
inline constexpr double kDivergentFraction = 0.15;

// Statistics of a set of samples (any unit; the benchmark uses seconds).
struct SampleStats {
  int count = 0;
  double median = 0;  // middle sample; mean of the two middle ones for an even count
  double mean = 0;
  double std = 0;  // population standard deviation: sqrt(sum((x - mean)^2) / count)
  double min = 0;
  double max = 0;
  bool divergent = false;  // |mean - median| > kDivergentFraction * median
};

// Statistics of `samples` (unsorted; not modified). All zero for an empty span.
SampleStats ComputeStats(std::span<const double> samples);

}  // namespace dequantd::bench
