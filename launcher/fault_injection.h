// Faults a test can inject into a real run through the environment, to show that what handles
// them works end to end (the spike detector's rollback, for one). Unset, nothing changes.
//
//   NF_INJECT_GRAD_SPIKE=8,20   the gradients of steps 8 and 20 are kGradSpikeFactor times
//                               what they would be (their loss weight is), as a bad batch
//                               would make them: the loss is the true one, the gradient norm
//                               spikes.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace nf::launcher {

inline constexpr float kGradSpikeFactor = 1000.0f;

// The steps NF_INJECT_GRAD_SPIKE names (empty when unset); InvalidArgument naming the variable
// when it is not a comma-separated list of positive step numbers.
absl::StatusOr<std::vector<int64_t>> InjectedGradSpikeSteps();

}  // namespace nf::launcher
