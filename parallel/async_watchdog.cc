#include "parallel/async_watchdog.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace nf::parallel {

std::string FailedInFlightReport(absl::string_view rank_label, const WaitTarget& target,
                                 int64_t step, absl::string_view message) {
  return absl::StrCat(rank_label, ": ", target.operation, " on group ", target.group, " (ranks [",
                      absl::StrJoin(target.group_ranks, ", "), "]) failed ",
                      step < 0 ? "before the first step" : absl::StrCat("at step ", step), ": ",
                      message, "; aborting the job");
}

void HardExit(int exit_code, const std::string& line) {
  WriteReportLine(line);
  _exit(exit_code);
}

AsyncWatchdog::AsyncWatchdog(Options options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Run(); });
}

AsyncWatchdog::~AsyncWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void AsyncWatchdog::Watch(WatchedOperation operation) {
  const Clock::time_point deadline =
      Clock::now() + absl::ToChronoNanoseconds(options_.watchdog.timeout);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.push_back({std::move(operation), deadline});
  }
  wake_.notify_all();
}

int64_t AsyncWatchdog::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(entries_.size());
}

void AsyncWatchdog::AwaitJobEnd() {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [this] { return ended_; });
}

void AsyncWatchdog::Run() {
  const auto interval = absl::ToChronoNanoseconds(options_.poll_interval);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !entries_.empty(); });
    if (stopping_) return;
    lock.unlock();
    const std::string report = PollOldest();
    if (!report.empty()) {
      aborting_ = true;
      options_.report(report);
      // Armed before anything that may hang: the dumps, ncclCommAbort (NCCL issue 992) and
      // MPI_Abort. Detached, as nothing waits for it: it ends the process or outlives a test.
      const int code = options_.watchdog.exit_code;
      const absl::Duration grace = options_.abort_grace;
      std::thread([hard_exit = options_.hard_exit, code, grace,
                   line = absl::StrCat(RankLabel(), ": the abort did not finish within ",
                                       absl::FormatDuration(grace),
                                       " of the watchdog's report (ncclCommAbort or MPI_Abort "
                                       "hung); exiting with ",
                                       code)] {
        std::this_thread::sleep_for(absl::ToChronoNanoseconds(grace));
        hard_exit(code, line);
      }).detach();
      RunWatchdogExpiryHook(report);
      options_.before_abort();
      options_.end_job(code);
      // Only a test's end_job returns: the watchdog has done its part.
      {
        std::lock_guard<std::mutex> relock(mutex_);
        ended_ = true;
      }
      wake_.notify_all();
      return;
    }
    lock.lock();
    if (!entries_.empty()) wake_.wait_for(lock, interval, [this] { return stopping_; });
  }
}

std::string AsyncWatchdog::PollOldest() {
  while (true) {
    const Entry* oldest = nullptr;
    {
      // Only this thread removes entries, and a deque's push_back leaves references to the
      // others valid: `oldest` may be polled without the lock.
      std::lock_guard<std::mutex> lock(mutex_);
      if (entries_.empty()) return std::string();
      oldest = &entries_.front();
    }
    const WatchedOperation& op = oldest->operation;
    const absl::StatusOr<bool> done = op.poll();
    if (done.ok() && *done) {
      std::lock_guard<std::mutex> lock(mutex_);
      entries_.pop_front();
      continue;
    }
    const WaitTarget target = {.operation = op.operation,
                               .group = op.group,
                               .group_ranks = op.group_ranks,
                               .peers = op.peers};
    if (!done.ok()) {
      return FailedInFlightReport(RankLabel(), target, CurrentStep(), done.status().message());
    }
    if (Clock::now() >= oldest->deadline) {
      return WatchdogReport(RankLabel(), target, options_.watchdog.timeout, CurrentStep(),
                            RankHosts());
    }
    return std::string();
  }
}

}  // namespace nf::parallel
