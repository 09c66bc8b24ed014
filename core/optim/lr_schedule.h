// Learning-rate schedules: linear warmup from 0 to the peak, then linear (fairseq's
// polynomial_decay with power 1), half-cosine or no decay down to min_lr. The launcher fills
// the struct from LrScheduleConfig (resolving decay_iters = 0 to train_iters) and calls
// Validate once; LearningRate is then evaluated before every optimizer update.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace nf::optim {

struct LrSchedule {
  enum class Decay { kLinear, kCosine, kConstant };
  float peak_lr;
  int64_t warmup_iters;  // updates of linear warmup from 0 to peak_lr; 0 starts at the peak
  int64_t decay_iters;   // the update at which decay reaches min_lr (unused by kConstant)
  float min_lr;          // the floor of the decay, held after decay_iters
  Decay decay;
};

// "linear", "cosine", "constant".
absl::string_view DecayName(LrSchedule::Decay decay);

// OK, or InvalidArgument with a one-line message naming the offending setting: lrs must be
// finite with 0 <= min_lr <= peak_lr, iteration counts non-negative, and a decaying schedule
// needs decay_iters > 0 and decay_iters >= warmup_iters.
absl::Status Validate(const LrSchedule& schedule);

// The learning rate of optimizer update `update`, counted from 1 (update 1 is the first
// optimizer step; values below 0 are treated as 0). Assumes Validate passed.
//   update <= warmup_iters:  peak_lr * update / warmup_iters
//   after warmup, with s = (update - warmup_iters) / (decay_iters - warmup_iters) in [0, 1]:
//     kLinear:   min_lr + (peak_lr - min_lr) * (1 - s)
//     kCosine:   min_lr + (peak_lr - min_lr) * (1 + cos(pi s)) / 2
//     kConstant: peak_lr
//   and min_lr from decay_iters on for the decaying schedules.
float LearningRate(const LrSchedule& schedule, int64_t update);

}  // namespace nf::optim
