// nf-plan as a user runs it (the binary of this build): every bad option is refused with one
// line naming the flag and the range it accepts, and the search's time does not grow with the
// cluster's size (launcher/plan_options.h states the bound).
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nf::launcher {
namespace {

using ::nf::testing::Lines;
using ::nf::testing::Outcome;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

class PlanCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // nf-plan on the shipped 2.7B config with `args`; under `timeout` so that a search that does
  // not end fails the test (exit 124) instead of hanging it. Only that it ends, and what it says,
  // are tested (its measured times are in docs/parallelism.md: timings are not tests).
  Outcome Plan(const std::vector<std::string>& args) {
    std::vector<std::string> all = {
        "120", NF_PLAN_BINARY, "--config",
        std::string(NF_SOURCE_DIR) + "/deploy/configs/normformer-2.7b.pbtxt"};
    all.insert(all.end(), args.begin(), args.end());
    return ::nf::testing::RunProgram("timeout", all, dir_);
  }

  std::filesystem::path dir_;
};

// Each refusal: exit 2, one line on stderr that names the flag and what it accepts, nothing on
// stdout (before: a bad number printed the 35-line usage, and 'inf', 5 or 10^8 were taken).
TEST_F(PlanCliTest, EveryBadOptionIsOneLineNamingTheFlagAndItsRange) {
  struct Case {
    std::vector<std::string> args;
    std::string names;  // the flag, and the range or reason
    std::string accepts;
  };
  const std::vector<Case> cases = {
      {{"--gemm-efficiency", "5"}, "--gemm-efficiency: '5'", "(0, 1]"},
      {{"--gemm-efficiency", "0"}, "--gemm-efficiency: '0'", "(0, 1]"},
      {{"--attention-efficiency", "1.5"}, "--attention-efficiency: '1.5'", "(0, 1]"},
      {{"--peak-tflops", "inf"}, "--peak-tflops: 'inf'", "(0, 100000] TFLOP/s"},
      {{"--peak-tflops", "nan"}, "--peak-tflops: 'nan'", "(0, 100000] TFLOP/s"},
      {{"--peak-tflops", "abc"}, "--peak-tflops: 'abc'", "(0, 100000] TFLOP/s"},
      {{"--hbm-gbps", "-1"}, "--hbm-gbps: '-1'", "(0, 1e+06] GB/s"},
      {{"--gpu-memory-gb", "1e300"}, "--gpu-memory-gb: '1e300'", "(0, 100000] GB"},
      {{"--nvlink-gbps", "0"}, "--nvlink-gbps: '0'", "GB/s"},
      {{"--network-gbps", "1e9"}, "--network-gbps: '1e9'", "GB/s"},
      {{"--latency-us", "-5"}, "--latency-us: '-5'", "us"},
      {{"--nodes", "100000000"}, "--nodes: '100000000'", "an integer from 1 to 1048576"},
      {{"--nodes", "0"}, "--nodes: '0'", "an integer from 1 to 1048576"},
      {{"--nodes", "99999999999999"}, "--nodes: '99999999999999'", "1 to 1048576"},
      {{"--gpus-per-node", "100000"}, "--gpus-per-node: '100000'", "an integer from 1 to 1024"},
      {{"--gpus-per-node", "2.5"}, "--gpus-per-node: '2.5'", "an integer from 1 to 1024"},
      {{"--top", "0"}, "--top: '0'", "an integer from 1 to 100000"},
      {{"--nodes"}, "--nodes needs a value", ""},
      {{"--bogus", "1"}, "unknown flag '--bogus'", "--help"},
      {{"--gpu", "v100"}, "--gpu: 'v100'", "h200, h100 or a100"},
      {{"--attention", "flash"}, "--attention: 'flash'", "blockwise or materialized"},
      {{"--overlap", "some"}, "--overlap: 'some'", "full or none"},
      {{"--nvlink-efficiency", "1.2"}, "--nvlink-efficiency: '1.2'", "(0, 1]"},
  };
  for (const Case& c : cases) {
    const Outcome o = Plan(c.args);
    const std::string what = absl::StrCat(c.args[0], " ", c.args.size() > 1 ? c.args[1] : "");
    EXPECT_EQ(o.exit_code, 2) << what << ": " << o.err;
    ASSERT_EQ(Lines(o.err).size(), 1u) << what << ":\n" << o.err;
    EXPECT_THAT(o.err, StartsWith("nf-plan: ")) << what;
    EXPECT_THAT(o.err, HasSubstr(c.names)) << what;
    EXPECT_THAT(o.err, HasSubstr(c.accepts)) << what;
    EXPECT_EQ(o.out, "") << what;
  }
}

TEST_F(PlanCliTest, HelpStatesTheRangesAndTheBound) {
  const Outcome o = Plan({"--help"});
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_THAT(o.out, HasSubstr("nodes, 1 to 1048576"));
  EXPECT_THAT(o.out, HasSubstr("1 to 1024"));
  EXPECT_THAT(o.out, HasSubstr("does not grow with --nodes"));
}

// The largest cluster nf-plan accepts (8 x 2^20 GPUs) is answered, and the refusal says why
// nothing splits (before: 5.8 s at 2^20 nodes, 46 s at 2^22, and "needs inf GB"). The search
// visits a fixed set of (tp, pp, v, ...) and estimates a layout only when its data-parallel size
// divides the batch, so its work is bounded by the batch, never by the world.
TEST_F(PlanCliTest, TheLargestClusterIsAnsweredAndTheRefusalIsFinite) {
  const Outcome large = Plan({"--nodes", "1048576"});
  EXPECT_EQ(large.exit_code, 3) << large.err;
  ASSERT_EQ(Lines(large.err).size(), 1u) << large.err;
  EXPECT_THAT(large.err, HasSubstr("splits train.global_batch_size (512) over 8388608 GPUs"));
  EXPECT_THAT(large.err, HasSubstr("at most 131072 GPUs"));  // 512 x tp 8 x pp 32
  EXPECT_THAT(large.err, Not(HasSubstr("inf")));
  // A batch that splits over 2^20 GPUs: its layouts are estimated.
  const Outcome splits =
      Plan({"--nodes", "131072", "--set", "train.global_batch_size=1048576", "--top", "1"});
  EXPECT_EQ(splits.exit_code, 0) << splits.err;
}

// A global batch of many micro-batches per GPU: before, 1 node with 2^20 sequences took 78 s
// walking each layout's schedule and 2^21 did not end in 120 s; now layouts over 2^16 passes a
// step are skipped, and a batch over 2^20 sequences is refused in one line.
TEST_F(PlanCliTest, LargeBatchesAreBounded) {
  const Outcome o =
      Plan({"--nodes", "1", "--set", "train.global_batch_size=1048576", "--top", "1"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  const Outcome beyond = Plan({"--set", "train.global_batch_size=2097152"});
  EXPECT_EQ(beyond.exit_code, 2);
  ASSERT_EQ(Lines(beyond.err).size(), 1u) << beyond.err;
  EXPECT_THAT(beyond.err, HasSubstr("train.global_batch_size (2097152)"));
  EXPECT_THAT(beyond.err, HasSubstr("at most 1048576"));
}

}  // namespace
}  // namespace nf::launcher
