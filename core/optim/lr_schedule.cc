// Learning-rate schedules. Everything is evaluated in double and rounded to fp32 once, so the
// schedule is exact to fp32 precision and the same on every rank.
#include "core/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"

namespace nf::optim {
namespace {

bool IsDecaying(LrSchedule::Decay decay) {
  return decay == LrSchedule::Decay::kLinear || decay == LrSchedule::Decay::kCosine;
}

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("LrSchedule: ", message));
}

}  // namespace

absl::string_view DecayName(LrSchedule::Decay decay) {
  switch (decay) {
    case LrSchedule::Decay::kLinear:
      return "linear";
    case LrSchedule::Decay::kCosine:
      return "cosine";
    case LrSchedule::Decay::kConstant:
      return "constant";
  }
  return "unknown";
}

absl::Status Validate(const LrSchedule& s) {
  if (s.decay != LrSchedule::Decay::kLinear && s.decay != LrSchedule::Decay::kCosine &&
      s.decay != LrSchedule::Decay::kConstant) {
    return Invalid(absl::StrCat("unknown decay kind ", static_cast<int>(s.decay)));
  }
  if (!std::isfinite(s.peak_lr) || s.peak_lr < 0) {
    return Invalid(absl::StrCat("peak_lr must be finite and >= 0, got ", s.peak_lr));
  }
  if (!std::isfinite(s.min_lr) || s.min_lr < 0) {
    return Invalid(absl::StrCat("min_lr must be finite and >= 0, got ", s.min_lr));
  }
  if (s.min_lr > s.peak_lr) {
    return Invalid(
        absl::StrCat("min_lr (", s.min_lr, ") must not exceed peak_lr (", s.peak_lr, ")"));
  }
  if (s.warmup_iters < 0) {
    return Invalid(absl::StrCat("warmup_iters must be >= 0, got ", s.warmup_iters));
  }
  if (s.decay_iters < 0) {
    return Invalid(absl::StrCat("decay_iters must be >= 0, got ", s.decay_iters));
  }
  if (IsDecaying(s.decay)) {
    if (s.decay_iters == 0) {
      return Invalid(absl::StrCat("decay_iters must be > 0 for ", DecayName(s.decay),
                                  " decay (the launcher maps 0 to train_iters)"));
    }
    if (s.decay_iters < s.warmup_iters) {
      return Invalid(absl::StrCat("decay_iters (", s.decay_iters, ") must be >= warmup_iters (",
                                  s.warmup_iters, ") for ", DecayName(s.decay), " decay"));
    }
  }
  return absl::OkStatus();
}

float LearningRate(const LrSchedule& s, int64_t update) {
  update = std::max<int64_t>(update, 0);
  const double peak = s.peak_lr, min_lr = s.min_lr;
  if (update <= s.warmup_iters && s.warmup_iters > 0) {
    return static_cast<float>(peak * static_cast<double>(update) /
                              static_cast<double>(s.warmup_iters));
  }
  if (!IsDecaying(s.decay)) return s.peak_lr;
  // Checked first so that decay_iters == warmup_iters (no decay span) never divides by zero.
  if (update >= s.decay_iters) return s.min_lr;
  const double progress = static_cast<double>(update - s.warmup_iters) /
                          static_cast<double>(s.decay_iters - s.warmup_iters);
  const double remaining = s.decay == LrSchedule::Decay::kLinear
                               ? 1.0 - progress
                               : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return static_cast<float>(min_lr + (peak - min_lr) * remaining);
}

}  // namespace nf::optim
