// nf-bench-flight-recorder: what the flight recorder (parallel/flight_recorder.h) costs per
// communication operation: Issued, Waiting and Completed of one operation, as an MPI call makes
// them, with the ring at its default capacity, against the same loop with recording off
// (capacity 0: the calls return at once). Median of 9 trials of 1,000,000 operations each; the
// cost per training step is this times the operations a step issues (docs/operations.md).
#include <chrono>
#include <cstdio>
#include <vector>

#include "bench/statistics.h"
#include "parallel/flight_recorder.h"

namespace {

using nf::parallel::CommOp;
using nf::parallel::FlightRecorder;

constexpr int kOperations = 1'000'000;
constexpr int kTrials = 9;

// Nanoseconds per recorded operation.
double NanosPerOperation(FlightRecorder& recorder) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 1; i <= kOperations; ++i) {
    const uint64_t id = recorder.Issued("tp", "mpi", i, CommOp::kAllReduce, -1, 4096,
                                        nf::DType::kF32);
    recorder.Waiting(id);
    recorder.Completed(id);
  }
  return nf::bench::Seconds(start) * 1e9 / kOperations;
}

}  // namespace

int main() {
  FlightRecorder& recorder = FlightRecorder::Get();
  std::vector<double> on, off;
  for (int trial = 0; trial < kTrials; ++trial) {
    recorder.SetCapacity(FlightRecorder::kDefaultCapacity);
    on.push_back(NanosPerOperation(recorder));
    recorder.SetCapacity(0);
    off.push_back(NanosPerOperation(recorder));
  }
  std::printf("flight recorder, %d operations x %d trials (medians):\n", kOperations, kTrials);
  std::printf("  recording (capacity %lld): %.1f ns per operation\n",
              static_cast<long long>(FlightRecorder::kDefaultCapacity), nf::bench::Median(on));
  std::printf("  off (capacity 0):          %.1f ns per operation\n", nf::bench::Median(off));
  return 0;
}
