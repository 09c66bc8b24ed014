// The collective watchdog for operations the host does not wait for. NCCL's collectives run on
// the GPU while the host goes on queueing kernels: a Wait() on them only makes the compute
// stream wait (nccl_communicator.h), so no host call is there to time them out. Instead, each
// communicator has an AsyncWatchdog with a thread of its own that polls the operations in
// flight, and ends the job exactly as a blocked host wait would (watchdog.h) when one
// outlives its deadline or fails (NCCL's asynchronous errors):
//
//   rank 3 (tp=1, dp=1, pp=0): all_reduce on group tp (ranks [2, 3]) did not complete within
//   300s at step 1200; waiting for peers [2]; aborting the job
//   rank 3 (tp=1, dp=1, pp=0): all_reduce on group tp (ranks [2, 3]) failed at step 1200:
//   ncclAllReduce of f16[4096] on cuda:3 failed: remote process exited; aborting the job
//
// (each one line in reality). Operations complete in the order they were watched, as those of
// one stream do, so each poll looks only at the oldest one still running: its cost is one poll
// per completed operation plus one. Device-independent: the NCCL communicator supplies the
// polls (an event query and ncclCommGetAsyncError); the tests use plain flags.
//
// A bounded end. The abort itself may hang (ncclCommAbort waiting for a kernel or proxy thread
// that never returns, NCCL issue 992; MPI_Abort on a wedged fabric): before the hook runs, the
// watchdog arms a hard exit, a detached timer that writes one line and _exits with the
// watchdog's exit code once `abort_grace` has passed, so the job always ends with 134 (and is
// requeued) within the deadline plus the grace.
//
// Host calls. NCCL also blocks the host: ncclCommInitRank until every rank joined, and
// ncclGroupEnd while it connects lazily to a peer that never comes. The communicator watches such
// a call as an operation whose poll says whether the call returned, so a peer that dies or never
// arrives before its first transfer gets the same report, dumps and abort.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "parallel/mpi_runtime.h"
#include "parallel/watchdog.h"

namespace nf::parallel {

// One operation in flight, with what the report names (WaitTarget's fields, owned).
struct WatchedOperation {
  std::string operation;         // CommOpName(op)
  std::string group;             // the group's name
  std::vector<int> group_ranks;  // world ranks, in group-rank order
  std::vector<int> peers;        // the ranks whose part may be missing
  // Called from the watchdog's thread: true once the operation completed, false while it runs,
  // an error when it failed.
  std::function<absl::StatusOr<bool>()> poll;
};

// "<rank label>: <op> on group <group> (ranks [...]) failed at step <step>: <message>;
// aborting the job" (no newline): the report of an operation that failed in flight.
std::string FailedInFlightReport(absl::string_view rank_label, const WaitTarget& target,
                                 int64_t step, absl::string_view message);

// How long the abort may take (the expiry hook's dumps, before_abort, end_job) before the hard
// exit ends the process.
inline constexpr absl::Duration kDefaultAbortGrace = absl::Seconds(15);

// The default hard exit: writes `line` (WriteReportLine) and _exits with `exit_code`.
[[noreturn]] void HardExit(int exit_code, const std::string& line);

class AsyncWatchdog {
 public:
  struct Options {
    WatchdogOptions watchdog;  // the deadline of each operation, from when it is watched
    // How often the thread polls while operations are in flight. A hang or an asynchronous
    // error is noticed this much later at most; an idle watchdog does not poll.
    absl::Duration poll_interval = absl::Milliseconds(1);
    // What happens, once, when an operation fails or expires: the report line is written
    // (to stderr by default), the hard exit is armed, the expiry hook runs (the flight
    // recorder's dumps), `before_abort` runs (ncclCommAbort, which stops NCCL's kernels and
    // proxy threads still waiting for absent peers), then the job ends (AbortJob with the
    // watchdog's exit code). Tests observe the report, the hard exit and the end instead.
    std::function<void(const std::string& report)> report = WriteReportLine;
    std::function<void()> before_abort = [] {};
    std::function<void(int exit_code)> end_job = AbortJob;
    // The hard exit, called with the exit code and its one line once `abort_grace` has passed
    // since the report, unless the process ended before (a detached thread: never cancelled).
    absl::Duration abort_grace = kDefaultAbortGrace;
    std::function<void(int exit_code, const std::string& line)> hard_exit = HardExit;
  };

  explicit AsyncWatchdog(Options options);
  // Stops the thread; operations still in flight are no longer watched.
  ~AsyncWatchdog();
  AsyncWatchdog(const AsyncWatchdog&) = delete;
  AsyncWatchdog& operator=(const AsyncWatchdog&) = delete;

  // Watches `operation` from now until its poll says it completed. Any thread.
  void Watch(WatchedOperation operation);
  // Operations not yet seen to complete. Any thread.
  int64_t in_flight() const;
  // True from the moment the watchdog gave up (before the report is written): the job is
  // ending, and no new NCCL call may start. Any thread.
  bool aborting() const { return aborting_.load(); }
  // Blocks until the watchdog has ended the job, which in production never returns (end_job
  // does not); a test's end_job returns, and so does this then. A thread that must not go on
  // once the watchdog gave up parks here. Any thread.
  void AwaitJobEnd();

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    WatchedOperation operation;
    Clock::time_point deadline;
  };

  void Run();
  // Polls the oldest operations in flight, dropping those that completed; the report when the
  // oldest one still running failed or passed its deadline, else empty.
  std::string PollOldest();

  const Options options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Entry> entries_;  // in the order watched
  bool stopping_ = false;
  bool ended_ = false;  // end_job returned (tests only)
  std::atomic<bool> aborting_{false};
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace nf::parallel
