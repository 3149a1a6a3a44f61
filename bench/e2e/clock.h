// Wall-clock helpers shared by the end-to-end benchmark's rows: elapsed seconds on the steady
// clock, and the nearest-rank percentile of a sample.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace dequantd::e2e {

using Clock = std::chrono::steady_clock;

// Seconds from `since` to now.
inline double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The nearest-rank `p` percentile (p in [0, 1]) of `v`; 0 for an empty sample.
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace dequantd::e2e
