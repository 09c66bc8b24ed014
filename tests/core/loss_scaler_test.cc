// DynamicLossScaler against Megatron-LM's DynamicGradScaler semantics, step by step: hysteresis
// before backing off, growth after exactly growth_interval finite steps, the min_scale floor,
// the skipped-step count, state save/restore, and config validation.
//
// Every scale here is a power of two times a power-of-two factor (or clamped to min_scale), so
// all expected scales are exact and compared with ==.
#include "core/optim/loss_scaler.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "test_util.h"

namespace nf::optim {
namespace {

using ::nf::testing::ExpectInvalidArgument;

constexpr LossScalerConfig kConfig{.initial_scale = 1024.0f,
                                   .growth_factor = 2.0f,
                                   .backoff_factor = 0.5f,
                                   .growth_interval = 3,
                                   .hysteresis = 2,
                                   .min_scale = 1.0f};

DynamicLossScaler MakeScaler(const LossScalerConfig& config = kConfig) {
  auto scaler = DynamicLossScaler::Create(config);
  NF_EXPECT_OK(scaler);
  return *std::move(scaler);
}

TEST(DynamicLossScalerTest, StartsFromTheConfig) {
  const DynamicLossScaler s = MakeScaler();
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.skipped_steps(), 0);
  EXPECT_EQ(
      s.state(),
      (LossScalerState{
          .scale = 1024.0f, .growth_tracker = 0, .hysteresis_tracker = 2, .skipped_steps = 0}));
}

TEST(DynamicLossScalerTest, BacksOffOnlyAfterHysteresisBadSteps) {
  DynamicLossScaler s = MakeScaler();
  s.Update(true);  // first overflow: tolerated (hysteresis 2)
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.state().hysteresis_tracker, 1);
  s.Update(true);  // second: backs off
  EXPECT_EQ(s.scale(), 512.0f);
  s.Update(true);  // the tracker is spent: every further overflow backs off (Megatron)
  EXPECT_EQ(s.scale(), 256.0f);
  EXPECT_EQ(s.state().hysteresis_tracker, -1);
  EXPECT_EQ(s.skipped_steps(), 3);
  // Three good steps grow the scale and refill the hysteresis ...
  for (int i = 0; i < 3; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_EQ(s.state().hysteresis_tracker, 2);
  // ... so a single overflow is tolerated again.
  s.Update(true);
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_EQ(s.skipped_steps(), 4);
}

TEST(DynamicLossScalerTest, GrowsAfterExactlyGrowthIntervalGoodSteps) {
  DynamicLossScaler s = MakeScaler();
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.state().growth_tracker, 2);
  s.Update(false);
  EXPECT_EQ(s.scale(), 2048.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  // An overflow resets the run of good steps even when hysteresis keeps the scale.
  s.Update(false);
  s.Update(false);
  s.Update(true);
  EXPECT_EQ(s.scale(), 2048.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 2048.0f);
  s.Update(false);
  EXPECT_EQ(s.scale(), 4096.0f);
  EXPECT_EQ(s.skipped_steps(), 1);
}

TEST(DynamicLossScalerTest, NeverBelowMinScale) {
  LossScalerConfig config = kConfig;
  config.initial_scale = 8.0f;
  config.min_scale = 3.0f;  // not a power of two: the floor is applied as is
  config.hysteresis = 1;
  DynamicLossScaler s = MakeScaler(config);
  s.Update(true);
  EXPECT_EQ(s.scale(), 4.0f);
  s.Update(true);
  EXPECT_EQ(s.scale(), 3.0f);  // max(2, 3)
  for (int i = 0; i < 5; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 3.0f);
  EXPECT_EQ(s.skipped_steps(), 7);
}

TEST(DynamicLossScalerTest, GrowthNeverOverflowsToInfinity) {
  LossScalerConfig config = kConfig;
  config.initial_scale = 0x1p126f;
  config.growth_interval = 1;
  DynamicLossScaler s = MakeScaler(config);
  s.Update(false);
  EXPECT_EQ(s.scale(), 0x1p127f);
  s.Update(false);  // 2^128 is not an fp32 number: the scale stays finite
  EXPECT_EQ(s.scale(), 0x1p127f);
  EXPECT_EQ(s.state().growth_tracker, 0);
}

TEST(DynamicLossScalerTest, StateRoundTripContinuesIdentically) {
  const std::vector<bool> history = {false, true, true, false, false, true, false, false, false};
  const std::vector<bool> future = {true, false, false, false, true, true, true, false};
  DynamicLossScaler original = MakeScaler();
  for (bool overflow : history) original.Update(overflow);
  const LossScalerState saved = original.state();

  DynamicLossScaler restored = MakeScaler();
  NF_ASSERT_OK(restored.SetState(saved));
  EXPECT_EQ(restored.state(), saved);
  for (bool overflow : future) {
    original.Update(overflow);
    restored.Update(overflow);
    EXPECT_EQ(restored.state(), original.state());
  }
}

TEST(DynamicLossScalerTest, SetStateRejectsNonsenseAndKeepsTheState) {
  DynamicLossScaler s = MakeScaler();
  s.Update(true);
  const LossScalerState before = s.state();
  const LossScalerState valid{
      .scale = 4.0f, .growth_tracker = 1, .hysteresis_tracker = 0, .skipped_steps = 9};
  std::vector<std::pair<LossScalerState, std::string>> cases;
  auto with = [&](auto edit, std::string mentions) {
    LossScalerState state = valid;
    edit(state);
    cases.emplace_back(state, std::move(mentions));
  };
  with([](LossScalerState& st) { st.scale = 0.0f; }, "scale must be finite and > 0, got 0");
  with([](LossScalerState& st) { st.scale = INFINITY; }, "scale must be finite");
  with([](LossScalerState& st) { st.scale = NAN; }, "scale must be finite");
  with([](LossScalerState& st) { st.growth_tracker = -1; }, "growth_tracker must be >= 0");
  with([](LossScalerState& st) { st.skipped_steps = -3; }, "skipped_steps must be >= 0, got -3");
  for (const auto& [state, mentions] : cases) {
    SCOPED_TRACE(mentions);
    ExpectInvalidArgument(s.SetState(state), "DynamicLossScaler::SetState", mentions);
    EXPECT_EQ(s.state(), before);
  }
}

TEST(DynamicLossScalerTest, RejectsInvalidConfigs) {
  std::vector<std::pair<LossScalerConfig, std::string>> cases;
  auto with = [&](auto edit, std::string mentions) {
    LossScalerConfig config = kConfig;
    edit(config);
    cases.emplace_back(config, std::move(mentions));
  };
  with([](LossScalerConfig& c) { c.initial_scale = 0.0f; }, "initial_scale must be finite and > 0");
  with([](LossScalerConfig& c) { c.initial_scale = INFINITY; }, "initial_scale must be finite");
  with([](LossScalerConfig& c) { c.min_scale = -1.0f; }, "min_scale must be finite and > 0");
  with([](LossScalerConfig& c) { c.min_scale = 2048.0f; },
       "min_scale (2048) must not exceed initial_scale (1024)");
  with([](LossScalerConfig& c) { c.growth_factor = 1.0f; }, "growth_factor must be finite and > 1");
  with([](LossScalerConfig& c) { c.backoff_factor = 1.0f; }, "backoff_factor must be in (0, 1)");
  with([](LossScalerConfig& c) { c.backoff_factor = 0.0f; }, "backoff_factor must be in (0, 1)");
  with([](LossScalerConfig& c) { c.backoff_factor = NAN; }, "backoff_factor must be in (0, 1)");
  with([](LossScalerConfig& c) { c.growth_interval = 0; }, "growth_interval must be >= 1, got 0");
  with([](LossScalerConfig& c) { c.hysteresis = -2; }, "hysteresis must be >= 1, got -2");
  for (const auto& [config, mentions] : cases) {
    SCOPED_TRACE(mentions);
    ExpectInvalidArgument(Validate(config), "LossScalerConfig", mentions);
    ExpectInvalidArgument(DynamicLossScaler::Create(config).status(), "LossScalerConfig", mentions);
  }
}

}  // namespace
}  // namespace nf::optim
