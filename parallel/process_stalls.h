// Did this process run? A thread that wakes every ~100 ms (the flight recorder's dumping
// thread) notes each wake here; a gap of a second or more between two notes means no thread of
// the process ran in between: it was stopped (SIGSTOP, a debugger), its VM was paused, or it was
// starved of CPU or blocked in uninterruptible I/O. The flight record carries the recent stalls,
// so that `nf-flight` can tell, of two ranks stuck in the same collective (both entered it, one
// was then stopped), the one that froze from the one that waited for it.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

namespace nf::parallel {

// A span of wall-clock time (nanoseconds since the Unix epoch) in which the process did not run.
struct ProcessStall {
  int64_t start_ns = 0, end_ns = 0;
};

class StallClock {
 public:
  // Ten wakes missed: not scheduling jitter, even on a loaded machine.
  static constexpr int64_t kMinStallNs = 1'000'000'000;
  static constexpr int kKept = 8;  // the most recent stalls, which are what a hang needs

  // A wake at `monotonic_ns` (CLOCK_MONOTONIC, which runs on while a process is stopped) and
  // `wall_ns` (CLOCK_REALTIME, what records of different ranks are merged on).
  void Note(int64_t monotonic_ns, int64_t wall_ns);
  // Note() with the clocks now.
  void NoteNow();

  std::vector<ProcessStall> Stalls() const;  // oldest first

 private:
  mutable std::mutex mutex_;
  int64_t last_monotonic_ns_ = -1;  // -1: no wake yet
  std::deque<ProcessStall> stalls_;
};

}  // namespace nf::parallel
