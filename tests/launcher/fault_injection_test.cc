// The test-only fault injections' variables (launcher/fault_injection.h): unset injects
// nothing; a well-formed value is read field by field; a malformed one (wrong count, not a
// number, below a field's minimum) is refused naming the variable, its value and the form.
#include "launcher/fault_injection.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/assert_ok.h"

namespace nf::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// `variable`=`value` while in scope.
class Env {
 public:
  Env(const char* variable, const char* value) : variable_(variable) { setenv(variable, value, 1); }
  ~Env() { unsetenv(variable_); }

 private:
  const char* variable_;
};

TEST(FaultInjectionTest, UnsetInjectsNothing) {
  const auto desync_read = InjectedDesyncOf();
  NF_ASSERT_OK(desync_read);
  const InjectedDesync desync = *desync_read;
  EXPECT_EQ(desync.world_rank, -1);
  const auto slow_read = InjectedSlowRankOf();
  NF_ASSERT_OK(slow_read);
  const InjectedSlowRank slow = *slow_read;
  EXPECT_EQ(slow.world_rank, -1);
  const auto nan_read = InjectedNanOf();
  NF_ASSERT_OK(nan_read);
  const InjectedNan nan = *nan_read;
  EXPECT_EQ(nan.step, 0);
  const auto spikes_read = InjectedGradSpikeSteps();
  NF_ASSERT_OK(spikes_read);
  const std::vector<int64_t> spikes = *spikes_read;
  EXPECT_TRUE(spikes.empty());
}

TEST(FaultInjectionTest, WellFormedValuesAreReadFieldByField) {
  {
    const Env env("NF_INJECT_DESYNC", "3:7");
    const auto desync_read = InjectedDesyncOf();
    NF_ASSERT_OK(desync_read);
    const InjectedDesync desync = *desync_read;
    EXPECT_EQ(desync.world_rank, 3);
    EXPECT_EQ(desync.step, 7);
  }
  {
    const Env env("NF_INJECT_SLOW_RANK", "0:400");
    const auto slow_read = InjectedSlowRankOf();
    NF_ASSERT_OK(slow_read);
    const InjectedSlowRank slow = *slow_read;
    EXPECT_EQ(slow.world_rank, 0);
    EXPECT_EQ(slow.milliseconds, 400);
  }
  {
    const Env env("NF_INJECT_NAN", "12:2:1");
    const auto nan_read = InjectedNanOf();
    NF_ASSERT_OK(nan_read);
    const InjectedNan nan = *nan_read;
    EXPECT_EQ(nan.step, 12);
    EXPECT_EQ(nan.layer, 2);
    EXPECT_EQ(nan.tp_rank, 1);
  }
  {
    const Env env("NF_INJECT_GRAD_SPIKE", "8,20");
    const auto spikes_read = InjectedGradSpikeSteps();
    NF_ASSERT_OK(spikes_read);
    const std::vector<int64_t> spikes = *spikes_read;
    EXPECT_THAT(spikes, ElementsAre(8, 20));
  }
}

TEST(FaultInjectionTest, MalformedValuesAreRefusedNamingTheForm) {
  for (const char* value : {"3", "3:7:1", "x:7", "-1:7", "3:0"}) {
    const Env env("NF_INJECT_DESYNC", value);
    EXPECT_THAT(InjectedDesyncOf().status().message(),
                HasSubstr(std::string("NF_INJECT_DESYNC='") + value + "' must be RANK:STEP"))
        << value;
  }
  for (const char* value : {"1", "1:0", "1:2:3"}) {
    const Env env("NF_INJECT_SLOW_RANK", value);
    EXPECT_THAT(InjectedSlowRankOf().status().message(),
                HasSubstr("must be RANK:MILLISECONDS (rank >= 0, delay >= 1)"))
        << value;
  }
  for (const char* value : {"0:2:1", "5:-1:0", "5:2", "5:2:1:0", "5:two:1"}) {
    const Env env("NF_INJECT_NAN", value);
    EXPECT_THAT(InjectedNanOf().status().message(),
                HasSubstr("must be STEP:LAYER:TP_RANK (step >= 1, layer >= 0, tp rank >= 0)"))
        << value;
  }
}

TEST(FaultInjectionTest, AbsentRankIsARankWithinTheJob) {
  const auto unset = InjectedAbsentRankOf();
  NF_ASSERT_OK(unset);
  EXPECT_EQ(*unset, -1);
  {
    const Env env("NF_INJECT_ABSENT_RANK", "3");
    const auto read = InjectedAbsentRankOf();
    NF_ASSERT_OK(read);
    EXPECT_EQ(*read, 3);
    TrainConfig config;
    NF_EXPECT_OK(CheckFaultInjection(config, 4));
    EXPECT_THAT(CheckFaultInjection(config, 2).message(),
                HasSubstr("NF_INJECT_ABSENT_RANK names world rank 3 but the job's world size is "
                          "2"));
  }
  for (const char* value : {"-1", "x", "1:2"}) {
    const Env env("NF_INJECT_ABSENT_RANK", value);
    EXPECT_THAT(InjectedAbsentRankOf().status().message(),
                HasSubstr(std::string("NF_INJECT_ABSENT_RANK='") + value +
                          "' must be RANK (world rank >= 0)"))
        << value;
  }
}

}  // namespace
}  // namespace nf::launcher
