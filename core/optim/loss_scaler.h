// Dynamic loss scaling for fp16 training, with Megatron-LM's semantics (DynamicGradScaler):
// the loss is multiplied by scale() before the backward pass so small fp16 gradients do not
// flush to zero; the optimizer unscales them and reports whether any came out non-finite, and
// Update() adapts the scale. Hysteresis lets a few isolated overflows pass before backing off;
// a run of growth_interval finite steps doubles (growth_factor) the scale again.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace nf::optim {

struct LossScalerConfig {
  float initial_scale;      // > 0
  float growth_factor;      // > 1
  float backoff_factor;     // in (0, 1)
  int64_t growth_interval;  // consecutive finite steps before growing, >= 1
  int64_t hysteresis;       // non-finite steps tolerated before backing off, >= 1
  float min_scale;          // floor of the scale, in (0, initial_scale]
};

// OK, or InvalidArgument with a one-line message naming the offending setting.
absl::Status Validate(const LossScalerConfig& config);

// Everything that evolves, so that a checkpoint can save and restore it exactly.
struct LossScalerState {
  float scale;
  int64_t growth_tracker;      // finite steps since the last growth or non-finite step
  int64_t hysteresis_tracker;  // non-finite steps left before backing off (may go below 0)
  int64_t skipped_steps;       // optimizer steps skipped (non-finite gradients, or an update
                               // that would overflow the model dtype), ever

  bool operator==(const LossScalerState&) const = default;
};

class DynamicLossScaler {
 public:
  static absl::StatusOr<DynamicLossScaler> Create(const LossScalerConfig& config);

  float scale() const { return state_.scale; }
  int64_t skipped_steps() const { return state_.skipped_steps; }
  const LossScalerConfig& config() const { return config_; }

  // After every optimizer step (taken or skipped); found_nonfinite is true for every skipped
  // step, an update that would overflow the model dtype included:
  //   non-finite: growth_tracker = 0; --hysteresis_tracker; if it is <= 0,
  //               scale = max(scale * backoff_factor, min_scale). The step counts as skipped.
  //   finite:     ++growth_tracker; when it reaches growth_interval, growth_tracker = 0,
  //               hysteresis_tracker = hysteresis and scale *= growth_factor.
  // As in Megatron, the hysteresis tracker is only refilled by a growth, so once it has run
  // out every further non-finite step backs off until the scale has grown again. Unlike
  // Megatron, a growth that would overflow fp32 to infinity is not applied (an infinite scale
  // would unscale every gradient to 0 or NaN).
  void Update(bool found_nonfinite);

  const LossScalerState& state() const { return state_; }
  // Restores a state saved by state(). InvalidArgument (leaving the state unchanged) unless the
  // scale is finite and positive and the counters are non-negative where they must be.
  absl::Status SetState(const LossScalerState& state);

 private:
  DynamicLossScaler(const LossScalerConfig& config, const LossScalerState& state)
      : config_(config), state_(state) {}

  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace nf::optim
