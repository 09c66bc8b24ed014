// Learning-rate schedules against closed forms evaluated here in double: linear warmup from 0,
// linear decay (fairseq's polynomial_decay, power 1) and half-cosine decay to min_lr, constant,
// and Validate's one-line rejections.
//
// LearningRate evaluates in double and rounds to fp32 once, so every comparison allows one fp32
// rounding of the expected value (kU32 relative); the endpoints (peak, min_lr) are returned
// exactly and compared with ==.
#include "core/optim/lr_schedule.h"

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf::optim {
namespace {

using ::nf::testing::ExpectInvalidArgument;
using ::nf::testing::kU32;

constexpr LrSchedule kLinear{.peak_lr = 1e-3f,
                             .warmup_iters = 4,
                             .decay_iters = 12,
                             .min_lr = 1e-5f,
                             .decay = LrSchedule::Decay::kLinear};

void ExpectLr(const LrSchedule& s, int64_t update, double expected) {
  // One rounding of the double result to fp32.
  EXPECT_NEAR(LearningRate(s, update), expected, kU32 * std::abs(expected))
      << DecayName(s.decay) << " at update " << update;
}

TEST(LrScheduleTest, WarmupIsLinearFromZero) {
  for (LrSchedule::Decay decay :
       {LrSchedule::Decay::kLinear, LrSchedule::Decay::kCosine, LrSchedule::Decay::kConstant}) {
    LrSchedule s = kLinear;
    s.decay = decay;
    NF_ASSERT_OK(Validate(s));
    EXPECT_EQ(LearningRate(s, 0), 0.0f);   // before the first update
    EXPECT_EQ(LearningRate(s, -5), 0.0f);  // clamped to 0
    for (int64_t u = 1; u <= 4; ++u) ExpectLr(s, u, double{s.peak_lr} * u / 4);
    EXPECT_EQ(LearningRate(s, 4), s.peak_lr);  // the peak is reached exactly at warmup_iters
  }
}

TEST(LrScheduleTest, LinearDecayReachesMinLrExactlyAtDecayIters) {
  const double peak = kLinear.peak_lr, min_lr = kLinear.min_lr;
  // fairseq: (peak - end) * (1 - (u - warmup) / (total - warmup)) + end over (4, 12].
  for (int64_t u = 5; u < 12; ++u) {
    ExpectLr(kLinear, u, min_lr + (peak - min_lr) * (1.0 - (u - 4) / 8.0));
  }
  ExpectLr(kLinear, 8, (peak + min_lr) / 2);  // halfway
  EXPECT_EQ(LearningRate(kLinear, 12), kLinear.min_lr);
  EXPECT_EQ(LearningRate(kLinear, 13), kLinear.min_lr);
  EXPECT_EQ(LearningRate(kLinear, 1'000'000), kLinear.min_lr);
  // Strictly decreasing over the decay span.
  for (int64_t u = 4; u < 12; ++u)
    EXPECT_GT(LearningRate(kLinear, u), LearningRate(kLinear, u + 1));
}

TEST(LrScheduleTest, CosineDecay) {
  LrSchedule s = kLinear;
  s.decay = LrSchedule::Decay::kCosine;
  const double peak = s.peak_lr, min_lr = s.min_lr;
  ExpectLr(s, 8, (peak + min_lr) / 2);  // the midpoint: cos(pi / 2) = 0
  // A quarter of the way: (1 + cos(pi / 4)) / 2 of the range remains.
  ExpectLr(s, 6, min_lr + (peak - min_lr) * (1 + std::cos(std::numbers::pi / 4)) / 2);
  ExpectLr(s, 10, min_lr + (peak - min_lr) * (1 + std::cos(3 * std::numbers::pi / 4)) / 2);
  EXPECT_EQ(LearningRate(s, 12), s.min_lr);
  EXPECT_EQ(LearningRate(s, 500), s.min_lr);
}

TEST(LrScheduleTest, ConstantAfterWarmup) {
  LrSchedule s = kLinear;
  s.decay = LrSchedule::Decay::kConstant;
  s.decay_iters = 0;  // unused by a constant schedule
  NF_ASSERT_OK(Validate(s));
  for (int64_t u : {5, 12, 13, 1'000'000}) EXPECT_EQ(LearningRate(s, u), s.peak_lr) << u;
  s.warmup_iters = 0;  // no warmup: the peak from the first update
  EXPECT_EQ(LearningRate(s, 1), s.peak_lr);
}

TEST(LrScheduleTest, DegenerateSpans) {
  // decay_iters == warmup_iters: the peak at the end of warmup, then min_lr at once.
  LrSchedule s = kLinear;
  s.decay_iters = s.warmup_iters;
  NF_ASSERT_OK(Validate(s));
  EXPECT_EQ(LearningRate(s, 4), s.peak_lr);
  EXPECT_EQ(LearningRate(s, 5), s.min_lr);
  // No warmup: decay starts from the peak at update 0.
  s = kLinear;
  s.warmup_iters = 0;
  s.decay = LrSchedule::Decay::kCosine;
  NF_ASSERT_OK(Validate(s));
  EXPECT_EQ(LearningRate(s, 0), s.peak_lr);
  ExpectLr(s, 6, (double{s.peak_lr} + s.min_lr) / 2);
}

TEST(LrScheduleTest, RejectsNonsense) {
  std::vector<std::pair<LrSchedule, std::string>> cases;
  auto with = [&](auto edit, std::string mentions) {
    LrSchedule s = kLinear;
    edit(s);
    cases.emplace_back(s, std::move(mentions));
  };
  with([](LrSchedule& s) { s.warmup_iters = -1; }, "warmup_iters must be >= 0, got -1");
  with([](LrSchedule& s) { s.decay_iters = -2; }, "decay_iters must be >= 0, got -2");
  with([](LrSchedule& s) { s.decay_iters = 3; },
       "decay_iters (3) must be >= warmup_iters (4) for linear decay");
  with(
      [](LrSchedule& s) {
        s.decay = LrSchedule::Decay::kCosine;
        s.warmup_iters = 0;
        s.decay_iters = 0;
      },
      "decay_iters must be > 0 for cosine decay");
  with([](LrSchedule& s) { s.min_lr = 2e-3f; }, "min_lr (0.002) must not exceed peak_lr (0.001)");
  with([](LrSchedule& s) { s.min_lr = -1e-5f; }, "min_lr must be finite and >= 0");
  with([](LrSchedule& s) { s.peak_lr = -1.0f; }, "peak_lr must be finite and >= 0, got -1");
  with([](LrSchedule& s) { s.peak_lr = NAN; }, "peak_lr must be finite");
  with([](LrSchedule& s) { s.peak_lr = INFINITY; }, "peak_lr must be finite");
  with([](LrSchedule& s) { s.decay = static_cast<LrSchedule::Decay>(7); }, "unknown decay kind 7");
  for (const auto& [schedule, mentions] : cases) {
    SCOPED_TRACE(mentions);
    const absl::Status status = Validate(schedule);
    ExpectInvalidArgument(status, "LrSchedule", mentions);
    EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos);  // one line
  }
  // decay_iters < warmup_iters is fine when nothing decays.
  LrSchedule constant = kLinear;
  constant.decay = LrSchedule::Decay::kConstant;
  constant.decay_iters = 1;
  NF_EXPECT_OK(Validate(constant));
}

}  // namespace
}  // namespace nf::optim
