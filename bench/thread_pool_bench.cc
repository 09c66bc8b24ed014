// What the thread pool costs a kernel: a loop of ParallelFor calls, each split into 8 chunks of
// a fixed amount of arithmetic, with single-threaded work between calls (a training step runs
// thousands of such kernels back to back, a few microseconds apart). Each figure is the median
// over 7 rounds of 2000 calls, next to the ideal of the same round: the chunks' work measured
// inline, divided by the thread count, plus the gap.
//
//   NF_NUM_THREADS=2 build/bench/nf-bench-thread-pool
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "bench/statistics.h"
#include "core/thread_pool.h"

namespace {

volatile double sink;  // keeps the work from being optimised away

// About `units` x 25 ns of dependent floating-point work.
void Work(int64_t units) {
  double s = 0.0;
  for (int64_t i = 0; i < units * 8; ++i) s += std::sqrt(static_cast<double>(i));
  sink = s;
}

template <typename F>
double MicrosPerCall(int calls, F&& call) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) call();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
             .count() /
         calls;
}

using nf::bench::Median;

}  // namespace

int main() {
  nf::ThreadPool& pool = nf::ThreadPool::Global();
  constexpr int kCalls = 2000, kRounds = 7, kChunks = 8;
  std::printf("threads %d; per call: 8 chunks of work, then the gap, single-threaded\n",
              pool.num_threads());
  std::printf("%10s %10s %12s %12s %10s\n", "work/chunk", "gap", "us/call", "ideal us", "ideal/us");
  for (int gap : {0, 4, 40}) {
    for (int work : {4, 40, 400}) {
      std::vector<double> measured, ideal;
      for (int round = 0; round < kRounds; ++round) {
        measured.push_back(MicrosPerCall(kCalls, [&] {
          pool.ParallelFor(kChunks, 1, [&](int64_t begin, int64_t end) {
            for (int64_t c = begin; c < end; ++c) Work(work);
          });
          Work(gap);
        }));
        const double chunks_inline = MicrosPerCall(kCalls, [&] {
          for (int c = 0; c < kChunks; ++c) Work(work);
        });
        const double gap_inline = MicrosPerCall(kCalls, [&] { Work(gap); });
        ideal.push_back(chunks_inline / pool.num_threads() + gap_inline);
      }
      const double us = Median(measured), best = Median(ideal);
      std::printf("%10d %10d %12.2f %12.2f %10.2f\n", work, gap, us, best, best / us);
    }
  }
  return 0;
}
