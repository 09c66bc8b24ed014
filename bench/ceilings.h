// Hardware ceilings measured at start-up of a benchmark run, so every figure of the run is
// reported as a ratio to what this machine, in this moment, can do. Medians of several trials,
// because the machines are shared and noisy.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace nf::bench {

struct Ceilings {
  double sgemm_gflops;         // OpenBLAS cblas_sgemm on all cores, fp32, square n = 1024
  double memcpy_gbytes_per_s;  // memcpy of 256 MiB on all cores: bytes read + written per second
};

// Measures both ceilings (takes about a second).
Ceilings MeasureCeilings();

// OpenBLAS on every core while in scope. The CPU backend runs OpenBLAS single-threaded under
// its own pool; the ceiling is OpenBLAS at its best on this machine.
class AllCoresBlas {
 public:
  AllCoresBlas();
  ~AllCoresBlas();
  AllCoresBlas(const AllCoresBlas&) = delete;
  AllCoresBlas& operator=(const AllCoresBlas&) = delete;

 private:
  int saved_threads_;
};

// Median of `trials` timings of fn(), in seconds.
template <typename F>
double MedianSeconds(int trials, F&& fn) {
  std::vector<double> seconds;
  for (int i = 0; i < trials; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace nf::bench
