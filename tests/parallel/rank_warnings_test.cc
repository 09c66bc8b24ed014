// Warnings name the rank that saw the problem, with its coordinates.
#include "parallel/rank_warnings.h"

#include "gtest/gtest.h"
#include "parallel/watchdog.h"

namespace nf::parallel {
namespace {

TEST(RankWarningsTest, LineNamesTheRankAndItsCoordinates) {
  SetRankLabel("rank 5 (tp=1, dp=0, pp=1)");
  EXPECT_EQ(RankWarning("disk full"),
            "normformer: warning: rank 5 (tp=1, dp=0, pp=1): disk full\n");
  ::testing::internal::CaptureStderr();
  WarnFromRank("slow writer");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "normformer: warning: rank 5 (tp=1, dp=0, pp=1): slow writer\n");
}

}  // namespace
}  // namespace nf::parallel
