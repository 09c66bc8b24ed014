// Per-op timing (core/ops/op_timing.h) on the CPU backend: off records nothing, on counts every
// call under its op's name with the wall-clock time it took, and a report empties the totals.
#include "core/ops/op_timing.h"

#include <map>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "core/ops/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "tests/assert_ok.h"

namespace nf {
namespace {

class OpTimingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ops::SetOpTimingEnabled(false);
    ops::TakeOpTimes();
  }
  void TearDown() override { ops::SetOpTimingEnabled(false); }
  Tensor x_ = testing::MakeTensor(DType::kF32, {64, 96}, testing::RandomFloats(64 * 96, 1));
  Tensor y_ = testing::MakeZeros(DType::kF32, {64, 96});
};

TEST_F(OpTimingTest, OffRecordsNothing) {
  NF_ASSERT_OK(ops::Axpy(1.0f, x_, y_));
  EXPECT_THAT(ops::TakeOpTimes(), ::testing::IsEmpty());
}

TEST_F(OpTimingTest, CountsEachCallUnderItsOpAndEmptiesOnReport) {
  ops::SetOpTimingEnabled(true);
  for (int i = 0; i < 3; ++i) NF_ASSERT_OK(ops::Axpy(0.5f, x_, y_));
  NF_ASSERT_OK(ops::Scale(y_, 2.0f));
  // An op refused by validation never reaches its backend and is not timed.
  EXPECT_FALSE(ops::Axpy(1.0f, x_, testing::MakeZeros(DType::kF32, {3})).ok());
  const std::vector<ops::OpTime> times = ops::TakeOpTimes();
  ASSERT_EQ(times.size(), 2u);
  for (const ops::OpTime& time : times) {
    EXPECT_THAT(time.op, ::testing::AnyOf("Axpy", "Scale"));
    EXPECT_EQ(time.calls, time.op == "Axpy" ? 3 : 1) << time.op;
    EXPECT_GT(time.seconds, 0.0) << time.op;
  }
  EXPECT_GE(times[0].seconds, times[1].seconds);  // longest first
  const std::string table = ops::FormatOpTimes(times);
  EXPECT_THAT(table, ::testing::HasSubstr("Axpy"));
  EXPECT_THAT(table, ::testing::HasSubstr("all ops"));
  EXPECT_THAT(ops::TakeOpTimes(), ::testing::IsEmpty());
}

// Past the pending-span bound the oldest are folded into the totals: nothing is lost.
TEST_F(OpTimingTest, ManyCallsAreAllCounted) {
  ops::SetOpTimingEnabled(true);
  constexpr int kCalls = 10000;
  for (int i = 0; i < kCalls; ++i) NF_ASSERT_OK(ops::Scale(y_, 1.0f));
  const std::vector<ops::OpTime> times = ops::TakeOpTimes();
  ASSERT_EQ(times.size(), 1u);
  EXPECT_EQ(times[0].calls, kCalls);
}

// An op with several implementations notes the one it took: its calls are filed, and shown,
// by path and reason; an op that notes nothing stays one plain row, even after another op's
// note on the same thread.
TEST_F(OpTimingTest, OpsThatChooseAnImplementationAreFiledByPathAndReason) {
  ops::SetOpTimingEnabled(true);
  auto backend = ops::BackendFor(Device::Cpu());
  NF_ASSERT_OK(backend);
  const auto run = [&](const char* path, const char* reason) {
    const ops::ScopedOpTiming timing("AttentionForward", **backend);
    if (path != nullptr) ops::NoteOpPath(path, reason);
  };
  run("cudnn", "fp16/bf16, head_dim 64");
  run("cudnn", "fp16/bf16, head_dim 64");
  run("own", "fp32 storage");
  {
    const ops::ScopedOpTiming outer("Outer", **backend);
    ops::NoteOpPath("fast", "because");
    run(nullptr, nullptr);  // a nested op without a note does not inherit the outer one's ...
  }                         // ... and the outer op keeps its own
  NF_ASSERT_OK(ops::Scale(y_, 1.0f));
  std::vector<ops::OpTime> times = ops::TakeOpTimes();
  std::map<std::string, ops::OpTime> by_row;
  for (const ops::OpTime& t : times) by_row[t.op + "|" + t.path + "|" + t.reason] = t;
  ASSERT_EQ(by_row.size(), 5u) << ops::FormatOpTimes(times);
  EXPECT_EQ(by_row["AttentionForward|cudnn|fp16/bf16, head_dim 64"].calls, 2);
  EXPECT_EQ(by_row["AttentionForward|own|fp32 storage"].calls, 1);
  EXPECT_EQ(by_row["AttentionForward||"].calls, 1);
  EXPECT_EQ(by_row["Outer|fast|because"].calls, 1);
  EXPECT_EQ(by_row["Scale||"].calls, 1);
  const std::string table = ops::FormatOpTimes(times);
  EXPECT_THAT(table, ::testing::HasSubstr("AttentionForward (cudnn)"));
  EXPECT_THAT(table, ::testing::HasSubstr("\nAttentionForward (own): fp32 storage\n"));
  EXPECT_THAT(table, ::testing::HasSubstr("\nAttentionForward (cudnn): fp16/bf16, head_dim 64\n"));
  EXPECT_THAT(table, ::testing::Not(::testing::HasSubstr("Scale (")));
}

}  // namespace
}  // namespace nf
