// Dynamic loss scaling (Megatron-LM's DynamicGradScaler), on the host: the scale is a plain
// float handed to the backward pass and to MixedPrecisionAdamW::UnscaleAndCheck.
#include "core/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace nf::optim {
namespace {

absl::Status Invalid(absl::string_view what, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", message));
}

}  // namespace

absl::Status Validate(const LossScalerConfig& c) {
  constexpr absl::string_view what = "LossScalerConfig";
  if (!std::isfinite(c.initial_scale) || !(c.initial_scale > 0)) {
    return Invalid(what,
                   absl::StrCat("initial_scale must be finite and > 0, got ", c.initial_scale));
  }
  if (!std::isfinite(c.min_scale) || !(c.min_scale > 0)) {
    return Invalid(what, absl::StrCat("min_scale must be finite and > 0, got ", c.min_scale));
  }
  if (c.min_scale > c.initial_scale) {
    return Invalid(what, absl::StrCat("min_scale (", c.min_scale,
                                      ") must not exceed initial_scale (", c.initial_scale, ")"));
  }
  if (!std::isfinite(c.growth_factor) || !(c.growth_factor > 1)) {
    return Invalid(what,
                   absl::StrCat("growth_factor must be finite and > 1, got ", c.growth_factor));
  }
  if (!(c.backoff_factor > 0 && c.backoff_factor < 1)) {
    return Invalid(what, absl::StrCat("backoff_factor must be in (0, 1), got ", c.backoff_factor));
  }
  if (c.growth_interval < 1) {
    return Invalid(what, absl::StrCat("growth_interval must be >= 1, got ", c.growth_interval));
  }
  if (c.hysteresis < 1) {
    return Invalid(what, absl::StrCat("hysteresis must be >= 1, got ", c.hysteresis));
  }
  return absl::OkStatus();
}

absl::StatusOr<DynamicLossScaler> DynamicLossScaler::Create(const LossScalerConfig& config) {
  if (absl::Status s = Validate(config); !s.ok()) return s;
  return DynamicLossScaler(config, {.scale = config.initial_scale,
                                    .growth_tracker = 0,
                                    .hysteresis_tracker = config.hysteresis,
                                    .skipped_steps = 0});
}

void DynamicLossScaler::Update(bool found_nonfinite) {
  if (found_nonfinite) {
    ++state_.skipped_steps;
    state_.growth_tracker = 0;
    --state_.hysteresis_tracker;
    if (state_.hysteresis_tracker <= 0) {
      state_.scale = std::max(state_.scale * config_.backoff_factor, config_.min_scale);
    }
    return;
  }
  ++state_.growth_tracker;
  // >= rather than == so that a tracker restored under a smaller growth_interval still grows.
  if (state_.growth_tracker >= config_.growth_interval) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker = config_.hysteresis;
    const float grown = state_.scale * config_.growth_factor;
    if (std::isfinite(grown)) state_.scale = grown;
  }
}

absl::Status DynamicLossScaler::SetState(const LossScalerState& state) {
  constexpr absl::string_view what = "DynamicLossScaler::SetState";
  if (!std::isfinite(state.scale) || !(state.scale > 0)) {
    return Invalid(what, absl::StrCat("scale must be finite and > 0, got ", state.scale));
  }
  if (state.growth_tracker < 0) {
    return Invalid(what, absl::StrCat("growth_tracker must be >= 0, got ", state.growth_tracker));
  }
  if (state.skipped_steps < 0) {
    return Invalid(what, absl::StrCat("skipped_steps must be >= 0, got ", state.skipped_steps));
  }
  state_ = state;
  return absl::OkStatus();
}

}  // namespace nf::optim
