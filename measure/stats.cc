#include "measure/stats.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dequantd::bench {

SampleStats ComputeStats(std::span<const double> samples) {
  SampleStats s;
  if (samples.empty()) return s;
  std::vector<double> sorted(samples.begin(), samples.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  s.count = static_cast<int>(n);
  s.median = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  double sum = 0;
  for (double x : sorted) sum += x;
  s.mean = sum / static_cast<double>(n);
  double squares = 0;
  for (double x : sorted) squares += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(squares / static_cast<double>(n));
  s.min = sorted.front();
  s.max = sorted.back();
  s.divergent = std::abs(s.mean - s.median) > kDivergentFraction * s.median;
  return s;
}

}  // namespace dequantd::bench
