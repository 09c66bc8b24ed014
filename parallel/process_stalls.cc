#include "parallel/process_stalls.h"

#include <time.h>

#include "parallel/flight_recorder.h"

namespace nf::parallel {

void StallClock::Note(int64_t monotonic_ns, int64_t wall_ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t gap = last_monotonic_ns_ < 0 ? 0 : monotonic_ns - last_monotonic_ns_;
  // Two threads may note at once; the later clock reading can arrive first.
  if (monotonic_ns > last_monotonic_ns_) last_monotonic_ns_ = monotonic_ns;
  if (gap < kMinStallNs) return;
  stalls_.push_back({.start_ns = wall_ns - gap, .end_ns = wall_ns});
  if (stalls_.size() > kKept) stalls_.pop_front();
}

void StallClock::NoteNow() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  Note(int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec, WallClockNanos());
}

std::vector<ProcessStall> StallClock::Stalls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {stalls_.begin(), stalls_.end()};
}

}  // namespace nf::parallel
