// Tests of parallel/watchdog.h in one process: the report line, the step and rank label, polls
// that complete or fail, and expiry ending the process with the report (a death test: without
// MPI, AbortJob exits with the code). The multi-rank expiry under mpirun is
// watchdog_probe_mpi.cc, run by expect_failure.sh.
#include "parallel/watchdog.h"

#include <cstdio>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/assert_ok.h"

namespace nf::parallel {
namespace {

TEST(WatchdogTest, ReportNamesRankOperationGroupStepAndPeers) {
  const int ranks[] = {1, 3, 5, 7};
  const int peers[] = {1, 5, 7};
  EXPECT_EQ(WatchdogReport(
                "rank 3 (tp=1, dp=1, pp=0)",
                {.operation = "all_reduce", .group = "dp", .group_ranks = ranks, .peers = peers},
                absl::Seconds(300), 1200),
            "rank 3 (tp=1, dp=1, pp=0): all_reduce on group dp (ranks [1, 3, 5, 7]) did not "
            "complete within 300s at step 1200; waiting for peers [1, 5, 7]; aborting the job");
  EXPECT_EQ(WatchdogReport("rank 0",
                           {.operation = "recv",
                            .group = "pp",
                            .group_ranks = ranks,
                            .peers = absl::MakeConstSpan(peers, 1)},
                           absl::Milliseconds(2500), -1),
            "rank 0: recv on group pp (ranks [1, 3, 5, 7]) did not complete within 2.5s before "
            "the first step; waiting for peers [1]; aborting the job");
}

TEST(WatchdogTest, ReportNamesPeerHostsOnlyAcrossNodes) {
  const int ranks[] = {0, 1, 2, 3};
  const int peers[] = {1, 3};
  const WaitTarget target = {
      .operation = "all_reduce", .group = "dp", .group_ranks = ranks, .peers = peers};
  const std::vector<std::string> two_nodes = {"n0", "n1", "n0", "n1"};
  EXPECT_THAT(WatchdogReport("rank 0", target, absl::Seconds(5), 3, two_nodes),
              ::testing::HasSubstr("waiting for peers [1 on n1, 3 on n1]; aborting the job"));
  const std::vector<std::string> one_node = {"n0", "n0", "n0", "n0"};
  EXPECT_THAT(WatchdogReport("rank 0", target, absl::Seconds(5), 3, one_node),
              ::testing::HasSubstr("waiting for peers [1, 3]; aborting the job"));
  SetRankHosts(two_nodes);
  EXPECT_EQ(RankHosts(), two_nodes);
  SetRankHosts({});
}

TEST(WatchdogTest, StepAndLabelAreSettable) {
  SetCurrentStep(41);
  EXPECT_EQ(CurrentStep(), 41);
  SetRankLabel("rank 9 (tp=1, dp=0, pp=2)");
  EXPECT_EQ(RankLabel(), "rank 9 (tp=1, dp=0, pp=2)");
  SetRankLabel("");
  EXPECT_EQ(RankLabel(), "rank 0");  // no label and no MPI: the only rank
  SetCurrentStep(-1);
}

TEST(WatchdogTest, ReturnsWhenThePollCompletesOrFails) {
  const int ranks[] = {0, 1};
  const WaitTarget target = {.operation = "barrier",
                             .group = "world",
                             .group_ranks = ranks,
                             .peers = absl::MakeConstSpan(ranks + 1, 1)};
  int polls = 0;
  // Past the spinning phase into the sleeps, well within the deadline.
  NF_EXPECT_OK(WaitUnderWatchdog([&]() -> absl::StatusOr<bool> { return ++polls == 100; }, target,
                                 {.timeout = absl::Seconds(30)}));
  EXPECT_EQ(polls, 100);
  const absl::Status failed = WaitUnderWatchdog(
      []() -> absl::StatusOr<bool> { return absl::InternalError("MPI error: boom"); }, target,
      {.timeout = absl::Seconds(30)});
  EXPECT_EQ(failed, absl::InternalError("MPI error: boom"));
}

TEST(WatchdogDeathTest, ExpiryPrintsTheReportAndExitsWithTheCode) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int ranks[] = {0, 1};
  const WaitTarget target = {.operation = "all_gather",
                             .group = "tp",
                             .group_ranks = ranks,
                             .peers = absl::MakeConstSpan(ranks + 1, 1)};
  auto never_done = []() -> absl::StatusOr<bool> { return false; };
  EXPECT_EXIT(
      {
        SetRankLabel("rank 0 (tp=0, dp=0, pp=0)");
        SetCurrentStep(7);
        (void)WaitUnderWatchdog(never_done, target, {.timeout = absl::Milliseconds(200)});
      },
      ::testing::ExitedWithCode(kWatchdogExitCode),
      "rank 0 \\(tp=0, dp=0, pp=0\\): all_gather on group tp \\(ranks \\[0, 1\\]\\) did not "
      "complete within 0.2s at step 7; waiting for peers \\[1\\]; aborting the job");
  EXPECT_EXIT((void)WaitUnderWatchdog(never_done, target,
                                      {.timeout = absl::Milliseconds(50), .exit_code = 77}),
              ::testing::ExitedWithCode(77), "did not complete within 0.05s");
}

TEST(WatchdogDeathTest, ExpiryRunsTheHookAfterTheReportAndBeforeTheExit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int ranks[] = {0, 1};
  const WaitTarget target = {.operation = "barrier",
                             .group = "world",
                             .group_ranks = ranks,
                             .peers = absl::MakeConstSpan(ranks + 1, 1)};
  EXPECT_EXIT((void)WaitUnderWatchdog([]() -> absl::StatusOr<bool> { return false; }, target,
                                      {.timeout = absl::Milliseconds(50)},
                                      [] { std::fputs("hook ran\n", stderr); }),
              ::testing::ExitedWithCode(kWatchdogExitCode),
              "did not complete within 0.05s.*aborting the job\nhook ran");
}

}  // namespace
}  // namespace nf::parallel
