// Tests of launcher/straggler_report.h: the slowest and fastest rank by compute time, compared
// within a pipeline stage only, and the flag. The end-to-end test (a slowed rank under mpirun)
// is straggler_mpi.sh.
#include "launcher/straggler_report.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace nf::launcher {
namespace {

// A rank that stepped for `step` s, of which it waited `comm` for communication and 0.1 for data.
RankTimes Times(double step, double comm) {
  return {.step = step, .comm_wait = comm, .data_wait = 0.1};
}

TEST(StragglerReportTest, TheSlowRankComputesLongestAndTheOthersWaitForIt) {
  // Every rank's steps take 2 s; rank 2 computes 1.8 s of them, the others 0.9 s and wait.
  const std::vector<RankTimes> ranks = {Times(2, 1.0), Times(2, 1.0), Times(2, 0.1), Times(2, 1.0)};
  const StragglerReport report = FindStragglers(ranks, {0, 0, 0, 0}, 1.25);
  EXPECT_EQ(report.slowest, 2);
  EXPECT_EQ(report.fastest, 0);
  EXPECT_NEAR(report.ratio, 1.8 / 0.9, 1e-12);
  EXPECT_TRUE(report.flagged);
  EXPECT_DOUBLE_EQ(ranks[2].compute(), 1.8);
}

TEST(StragglerReportTest, ABalancedJobIsNotFlagged) {
  const StragglerReport report =
      FindStragglers({Times(2, 1.0), Times(2, 0.95), Times(2, 1.05)}, {0, 0, 0}, 1.25);
  EXPECT_FALSE(report.flagged);
  EXPECT_LT(report.ratio, 1.25);
}

TEST(StragglerReportTest, StagesAreComparedOnlyWithinThemselves) {
  // Stage 1 (ranks 2, 3) computes twice what stage 0 does, as a stage with the head may: not a
  // straggler. Rank 1 of stage 0 is one.
  const std::vector<RankTimes> ranks = {Times(4, 3.0), Times(4, 2.4), Times(4, 1.9), Times(4, 1.9)};
  const StragglerReport report = FindStragglers(ranks, {0, 0, 1, 1}, 1.25);
  EXPECT_EQ(report.slowest, 1);
  EXPECT_EQ(report.fastest, 0);
  EXPECT_NEAR(report.ratio, 1.5 / 0.9, 1e-12);
  EXPECT_TRUE(report.flagged);
}

TEST(StragglerReportTest, OneRankPerStageComparesNothing) {
  const StragglerReport report = FindStragglers({Times(2, 1.5), Times(2, 0.1)}, {0, 1}, 1.25);
  EXPECT_EQ(report.ratio, 1.0);
  EXPECT_FALSE(report.flagged);
}

TEST(StragglerReportTest, CommunicationWaitBeyondTheStepIsNoNegativeCompute) {
  const std::vector<RankTimes> ranks = {Times(1, 2.0), Times(1, 0.0)};
  EXPECT_EQ(ranks[0].compute(), 0.0);
  EXPECT_TRUE(std::isinf(FindStragglers(ranks, {0, 0}, 1.25).ratio));
}

}  // namespace
}  // namespace nf::launcher
