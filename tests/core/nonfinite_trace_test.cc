// The NaN-origin search's instrument (core/ops/nonfinite_trace.h) on the CPU backend: with a
// trace open, the first op of a pass that wrote a NaN or an infinity is named with its output,
// element, value and the labels open around it; later ones do not replace it; a new pass starts
// afresh; fp16 overflow counts; integer outputs and closed traces are not searched.
#include "core/ops/nonfinite_trace.h"

#include <cmath>
#include <limits>

#include "core/ops/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "tests/assert_ok.h"

namespace nf {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(NonFiniteTraceTest, TheFirstOpOfAPassThatWroteANaNIsNamedWithItsLabels) {
  const Tensor x = testing::MakeZeros(DType::kF32, {4, 8});
  const Tensor y = testing::MakeZeros(DType::kF32, {4, 8});
  ops::NonFiniteTrace trace;
  trace.BeginPass();
  const ops::OpLabel layer("layer", 3);
  ops::OpLabel part("attn_norm");
  NF_ASSERT_OK(ops::Fill(x, 1.0f));  // op 0: finite
  part.Rename("fc1");
  x.data<float>()[13] = kNaN;           // as a corrupted input would be
  NF_ASSERT_OK(ops::Axpy(2.0f, x, y));  // op 1: y[13] = NaN
  NF_ASSERT_OK(ops::Scale(x, std::numeric_limits<float>::infinity()));  // op 2: later
  ASSERT_TRUE(trace.first().has_value());
  const ops::NonFiniteOutput& found = *trace.first();
  EXPECT_EQ(found.op_index, 1);
  EXPECT_EQ(found.op, "Axpy");
  EXPECT_EQ(found.where, "layer 3 / fc1");
  EXPECT_EQ(found.output, "y");
  EXPECT_EQ(found.tensor, "f32[4, 8] on cpu");
  EXPECT_EQ(found.element, 13);
  EXPECT_TRUE(std::isnan(found.value));
  EXPECT_EQ(ops::NonFiniteName(found.value), "nan");
  NF_EXPECT_OK(trace.status());

  trace.BeginPass();
  EXPECT_FALSE(trace.first().has_value());
  NF_ASSERT_OK(ops::Fill(y, -std::numeric_limits<float>::infinity()));
  ASSERT_TRUE(trace.first().has_value());
  EXPECT_EQ(trace.first()->op_index, 0);
  EXPECT_EQ(trace.first()->op, "Fill");
  EXPECT_EQ(ops::NonFiniteName(trace.first()->value), "-inf");
}

TEST(NonFiniteTraceTest, AnFp16OverflowIsAnInfinity) {
  const Tensor big = testing::MakeTensor(DType::kF32, {2}, {1.0f, 1e6f});
  const Tensor half = testing::MakeZeros(DType::kF16, {2});
  ops::NonFiniteTrace trace;
  trace.BeginPass();
  NF_ASSERT_OK(ops::Cast(big, half));  // 1e6 is past fp16's 65504
  ASSERT_TRUE(trace.first().has_value());
  EXPECT_EQ(trace.first()->op, "Cast");
  EXPECT_EQ(trace.first()->output, "dst");
  EXPECT_EQ(trace.first()->element, 1);
  EXPECT_EQ(ops::NonFiniteName(trace.first()->value), "inf");
}

TEST(NonFiniteTraceTest, NothingIsSearchedWithoutAnOpenTrace) {
  const Tensor x = testing::MakeZeros(DType::kF32, {4});
  {
    ops::NonFiniteTrace trace;
    trace.BeginPass();
    NF_ASSERT_OK(ops::Fill(x, 1.0f));
    EXPECT_FALSE(trace.first().has_value());
  }
  // Closed: a NaN now goes unnoticed by a trace opened later for another pass.
  NF_ASSERT_OK(ops::Fill(x, kNaN));
  ops::NonFiniteTrace later;
  later.BeginPass();
  EXPECT_FALSE(later.first().has_value());
}

TEST(NonFiniteTraceTest, AnInnerTraceHidesTheOuterUntilItCloses) {
  const Tensor x = testing::MakeZeros(DType::kF32, {4});
  ops::NonFiniteTrace outer;
  outer.BeginPass();
  {
    ops::NonFiniteTrace inner;
    inner.BeginPass();
    NF_ASSERT_OK(ops::Fill(x, kNaN));
    EXPECT_TRUE(inner.first().has_value());
  }
  EXPECT_FALSE(outer.first().has_value());
  NF_ASSERT_OK(ops::Scale(x, 1.0f));
  ASSERT_TRUE(outer.first().has_value());
  EXPECT_EQ(outer.first()->op, "Scale");
}

TEST(NonFiniteTraceTest, LabelsNestAndCloseWithTheirScope) {
  EXPECT_EQ(ops::CurrentOpLabels(), "");
  {
    const ops::OpLabel layer("layer", 0);
    {
      ops::OpLabel part("qkv");
      EXPECT_EQ(ops::CurrentOpLabels(), "layer 0 / qkv");
      part.Rename("attention");
      EXPECT_EQ(ops::CurrentOpLabels(), "layer 0 / attention");
    }
    EXPECT_EQ(ops::CurrentOpLabels(), "layer 0");
  }
  EXPECT_EQ(ops::CurrentOpLabels(), "");
}

}  // namespace
}  // namespace nf
