// Summaries the benchmarks report: medians (the machines are shared and noisy, so never means),
// a distribution-free confidence interval for a median, and elapsed wall time.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace nf::bench {

// The upper median of `v` (non-empty).
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median of `v` (non-empty) and a 95% confidence interval for it: the order statistics at
// n/2 -+ 1.96 sqrt(n)/2 (the normal approximation of the binomial count below the median).
struct MedianInterval {
  double median, low, high;
};
inline MedianInterval MedianWithInterval(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const int n = static_cast<int>(v.size());
  const int half_width = static_cast<int>(std::ceil(1.96 * std::sqrt(n) / 2));
  return {.median = v[n / 2],
          .low = v[std::max(0, n / 2 - half_width)],
          .high = v[std::min(n - 1, n / 2 + half_width)]};
}

// Seconds since `start`.
inline double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace nf::bench
