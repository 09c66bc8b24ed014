// nf-launch --dry-run: what a configuration would do on a world of N ranks, without training or
// communicating: the resolved configuration, the layout (refused with the reason when it does
// not fit), FLOPs per step, and per pipeline rank the parameters it holds and the memory for
// parameters, gradients, optimizer state and the activations of its peak micro-batches in flight.
#pragma once

#include <ostream>

#include "absl/status/status.h"
#include "launcher/train_config.pb.h"

namespace nf::launcher {

// InvalidArgument, naming what does not fit and what would, for a layout that cannot run.
absl::Status DryRun(const TrainConfig& config, int world_size, std::ostream& out);

}  // namespace nf::launcher
