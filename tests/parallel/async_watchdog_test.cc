// Tests of parallel/async_watchdog.h: operations polled from the watchdog's own thread are
// dropped once complete, and one that fails or outlives its deadline is reported once, the hook
// runs, and the job ends, in that order. The operations are flags the test sets; every wait is
// for a state (no sleeps), and deadlines are either far beyond the test (300 s) or already
// past (0), so a loaded machine changes nothing. The hard exit that bounds the abort is armed
// before the hook runs: a hook that hangs (ncclCommAbort, NCCL issue 992) still ends the job.
#include "parallel/async_watchdog.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nf::parallel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// What the watchdog did when it gave up, in order: "report: ...", "hook", "end <code>".
class Outcome {
 public:
  void Add(std::string event) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      events_.push_back(std::move(event));
    }
    changed_.notify_all();
  }
  // Blocks until the job was ended, then returns the events.
  std::vector<std::string> AwaitEnd() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !events_.empty() && events_.back().starts_with("end"); });
    return events_;
  }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mutex_);
    return events_;
  }
  // Blocks until an event starting with `prefix` was added, or `limit` passed: whether it was.
  bool AwaitEvent(const std::string& prefix, std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, limit, [&] {
      for (const std::string& e : events_) {
        if (e.starts_with(prefix)) return true;
      }
      return false;
    });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> events_;
};

// The hard exit's grace is far beyond the test (its detached timer never fires) unless a test
// sets it.
AsyncWatchdog::Options Observed(Outcome& outcome, absl::Duration timeout) {
  return {.watchdog = {.timeout = timeout, .exit_code = 77},
          .report = [&outcome](const std::string& line) { outcome.Add("report: " + line); },
          .before_abort = [&outcome] { outcome.Add("hook"); },
          .end_job = [&outcome](int code) { outcome.Add("end " + std::to_string(code)); },
          .abort_grace = absl::Hours(24),
          .hard_exit =
              [&outcome](int code, const std::string& line) {
                outcome.Add("hard exit " + std::to_string(code) + ": " + line);
              }};
}

// An operation that completes when the test says so and counts its polls.
struct Flag {
  std::atomic<bool> done{false};
  std::atomic<int> polls{0};
};

WatchedOperation Operation(std::shared_ptr<Flag> flag, std::string operation = "all_reduce") {
  return {.operation = std::move(operation),
          .group = "tp",
          .group_ranks = {2, 3},
          .peers = {3},
          .poll = [flag]() -> absl::StatusOr<bool> {
            ++flag->polls;
            return flag->done.load();
          }};
}

void AwaitNoneInFlight(const AsyncWatchdog& watchdog) {
  while (watchdog.in_flight() > 0) std::this_thread::yield();
}

TEST(AsyncWatchdogTest, DropsOperationsOnceTheyCompleteAndReportsNothing) {
  Outcome outcome;
  AsyncWatchdog watchdog(Observed(outcome, absl::Seconds(300)));
  std::vector<std::shared_ptr<Flag>> flags;
  for (int i = 0; i < 3; ++i) {
    flags.push_back(std::make_shared<Flag>());
    watchdog.Watch(Operation(flags.back()));
  }
  EXPECT_GE(watchdog.in_flight(), 1);
  for (auto& flag : flags) flag->done = true;
  AwaitNoneInFlight(watchdog);
  // Watching again after it went idle works the same.
  auto later = std::make_shared<Flag>();
  later->done = true;
  watchdog.Watch(Operation(later));
  AwaitNoneInFlight(watchdog);
  EXPECT_GE(later->polls.load(), 1);
  EXPECT_TRUE(outcome.events().empty());
}

TEST(AsyncWatchdogTest, PollsOnlyTheOldestOperationStillRunning) {
  Outcome outcome;
  AsyncWatchdog watchdog(Observed(outcome, absl::Seconds(300)));
  auto first = std::make_shared<Flag>();
  auto second = std::make_shared<Flag>();
  second->done = true;  // done on its own, but behind `first` on the same stream
  watchdog.Watch(Operation(first));
  watchdog.Watch(Operation(second));
  while (first->polls < 3) std::this_thread::yield();
  EXPECT_EQ(second->polls.load(), 0);
  EXPECT_EQ(watchdog.in_flight(), 2);
  first->done = true;
  AwaitNoneInFlight(watchdog);
  EXPECT_EQ(second->polls.load(), 1);
}

TEST(AsyncWatchdogTest, AnExpiredOperationIsReportedThenTheHookRunsThenTheJobEnds) {
  SetRankLabel("rank 3 (tp=1, dp=1, pp=0)");
  SetCurrentStep(1200);
  Outcome outcome;
  AsyncWatchdog watchdog(Observed(outcome, absl::ZeroDuration()));
  watchdog.Watch(Operation(std::make_shared<Flag>()));
  EXPECT_THAT(outcome.AwaitEnd(),
              ElementsAre("report: rank 3 (tp=1, dp=1, pp=0): all_reduce on group tp (ranks "
                          "[2, 3]) did not complete within 0s at step 1200; waiting for peers "
                          "[3]; aborting the job",
                          "hook", "end 77"));
  SetRankLabel("");
  SetCurrentStep(-1);
}

TEST(AsyncWatchdogTest, AFailedOperationIsReportedWithItsErrorBeforeItsDeadline) {
  SetCurrentStep(5);
  Outcome outcome;
  AsyncWatchdog watchdog(Observed(outcome, absl::Seconds(300)));
  auto done = std::make_shared<Flag>();
  done->done = true;
  watchdog.Watch(Operation(done));
  WatchedOperation failing = Operation(std::make_shared<Flag>(), "recv");
  failing.poll = []() -> absl::StatusOr<bool> {
    return absl::InternalError("ncclRecv of f16[8] on cuda:3 failed: remote process exited");
  };
  watchdog.Watch(std::move(failing));
  const std::vector<std::string> events = outcome.AwaitEnd();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_THAT(events[0], HasSubstr(": recv on group tp (ranks [2, 3]) failed at step 5: ncclRecv "
                                   "of f16[8] on cuda:3 failed: remote process exited; aborting "
                                   "the job"));
  EXPECT_EQ(events[1], "hook");
  EXPECT_EQ(events[2], "end 77");
  SetCurrentStep(-1);
}

// The abort may hang (ncclCommAbort, NCCL issue 992): the hard exit is armed before the hook
// runs, so with no grace it fires while the hook still waits; the hook here waits for it (10 s at
// most: without the hard exit the events show the hook alone).
TEST(AsyncWatchdogTest, TheHardExitIsArmedBeforeTheHookRuns) {
  SetRankLabel("rank 3 (tp=1, dp=1, pp=0)");
  Outcome outcome;
  AsyncWatchdog::Options options = Observed(outcome, absl::ZeroDuration());
  options.abort_grace = absl::ZeroDuration();
  options.before_abort = [&outcome] {
    outcome.Add(outcome.AwaitEvent("hard exit", std::chrono::seconds(10)) ? "hook"
                                                                          : "hook, no hard exit");
  };
  AsyncWatchdog watchdog(std::move(options));
  EXPECT_FALSE(watchdog.aborting());
  watchdog.Watch(Operation(std::make_shared<Flag>()));
  const std::vector<std::string> events = outcome.AwaitEnd();
  ASSERT_EQ(events.size(), 4u) << ::testing::PrintToString(events);
  EXPECT_THAT(events[0], HasSubstr("report: rank 3"));
  EXPECT_EQ(events[1],
            "hard exit 77: rank 3 (tp=1, dp=1, pp=0): the abort did not finish within 0 of the "
            "watchdog's report (ncclCommAbort or MPI_Abort hung); exiting with 77");
  EXPECT_EQ(events[2], "hook");
  EXPECT_EQ(events[3], "end 77");
  EXPECT_TRUE(watchdog.aborting());
  watchdog.AwaitJobEnd();  // returns: this end_job returned
  SetRankLabel("");
}

// Until the grace passes the hard exit waits: an abort that finishes ends the job itself.
TEST(AsyncWatchdogTest, AnAbortThatFinishesEndsTheJobBeforeTheHardExit) {
  Outcome outcome;
  AsyncWatchdog::Options options = Observed(outcome, absl::ZeroDuration());
  options.abort_grace = absl::Seconds(30);
  AsyncWatchdog watchdog(std::move(options));
  watchdog.Watch(Operation(std::make_shared<Flag>()));
  EXPECT_THAT(outcome.AwaitEnd(), ElementsAre(HasSubstr("report: "), "hook", "end 77"));
}

TEST(AsyncWatchdogTest, ReportNamesTheStepOrItsAbsence) {
  const int ranks[] = {0, 1};
  const int peers[] = {1};
  const WaitTarget target = {
      .operation = "broadcast", .group = "dp", .group_ranks = ranks, .peers = peers};
  EXPECT_EQ(FailedInFlightReport("rank 0", target, -1, "boom"),
            "rank 0: broadcast on group dp (ranks [0, 1]) failed before the first step: boom; "
            "aborting the job");
}

TEST(AsyncWatchdogTest, StopsWithOperationsStillInFlight) {
  Outcome outcome;
  auto stuck = std::make_shared<Flag>();
  {
    AsyncWatchdog watchdog(Observed(outcome, absl::Seconds(300)));
    watchdog.Watch(Operation(stuck));
    while (stuck->polls < 1) std::this_thread::yield();
  }  // joins its thread without waiting for the operation
  EXPECT_TRUE(outcome.events().empty());
}

TEST(AsyncWatchdogDeathTest, ByDefaultTheReportGoesToStderrAndTheJobExitsWithTheCode) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        AsyncWatchdog watchdog(
            {.watchdog = {.timeout = absl::ZeroDuration(), .exit_code = kWatchdogExitCode}});
        watchdog.Watch(Operation(std::make_shared<Flag>(), "all_gather"));
        while (true) std::this_thread::yield();  // the host goes on; the watchdog ends the job
      },
      ::testing::ExitedWithCode(kWatchdogExitCode),
      "all_gather on group tp \\(ranks \\[2, 3\\]\\) did not complete within 0s");
}

// The real hard exit: a hook that never returns (ncclCommAbort under NCCL issue 992) still ends
// the process with the watchdog's code, saying why, once the grace has passed.
TEST(AsyncWatchdogDeathTest, AHungAbortEndsTheProcessWithTheCodeAfterTheGrace) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        AsyncWatchdog watchdog(
            {.watchdog = {.timeout = absl::ZeroDuration(), .exit_code = kWatchdogExitCode},
             .before_abort =
                 [] {
                   while (true) std::this_thread::sleep_for(std::chrono::hours(1));
                 },
             .abort_grace = absl::Milliseconds(200)});
        watchdog.Watch(Operation(std::make_shared<Flag>(), "all_gather"));
        while (true) std::this_thread::yield();
      },
      ::testing::ExitedWithCode(kWatchdogExitCode),
      "all_gather on group tp(.|\n)*the abort did not finish within 200ms of the watchdog's "
      "report \\(ncclCommAbort or MPI_Abort hung\\); exiting with 134");
}

}  // namespace
}  // namespace nf::parallel
