// Faults a test can inject into a real run through the environment, to show that what handles
// them works end to end (the spike detector's rollback, for one). Unset, nothing changes.
//
//   NF_INJECT_GRAD_SPIKE=8,20   the gradients of steps 8 and 20 are kGradSpikeFactor times
//                               what they would be (their loss weight is), as a bad batch
//                               would make them: the loss is the true one, the gradient norm
//                               spikes.
//   NF_INJECT_DESYNC=1:6        world rank 1 issues one barrier on the world group that no
//                               other rank issues, at the start of step 6: the collectives of
//                               the ranks no longer line up and the job hangs, as a schedule
//                               bug would make it (the flight recorder's test).
//   NF_INJECT_SLOW_RANK=1:80    world rank 1 spends 80 ms more on every step's own work, as a
//                               slow node would (the straggler report's test).
//   NF_INJECT_NAN=5:2:1         during step 5, the first element of layer 2's fc1 weight is NaN
//                               on tensor-parallel rank 1 (of the stage holding the layer, in
//                               every data-parallel replica), as a corrupted weight would make
//                               it; the weight is restored after the step (train.nan_origin's
//                               test).
//   NF_INJECT_ABSENT_RANK=1     world rank 1 sets up everything (on GPUs: joins every NCCL
//                               communicator) and then never issues the collectives of its
//                               first step: it sleeps until the job is ended, as a rank stuck
//                               before its first collective would (the emulated GPU's failure
//                               scenarios: the others' watchdogs name it).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/train_config.pb.h"

namespace nf::launcher {

inline constexpr float kGradSpikeFactor = 1000.0f;

// The steps NF_INJECT_GRAD_SPIKE names (empty when unset); InvalidArgument naming the variable
// when it is not a comma-separated list of positive step numbers.
absl::StatusOr<std::vector<int64_t>> InjectedGradSpikeSteps();

struct InjectedDesync {
  int world_rank = -1;  // -1: none
  int64_t step = 0;
};
// NF_INJECT_DESYNC's rank and step (rank -1 when unset); InvalidArgument naming the variable
// when it is not RANK:STEP.
absl::StatusOr<InjectedDesync> InjectedDesyncOf();

struct InjectedSlowRank {
  int world_rank = -1;  // -1: none
  int64_t milliseconds = 0;
};
// NF_INJECT_SLOW_RANK's rank and delay (rank -1 when unset); InvalidArgument naming the variable
// when it is not RANK:MILLISECONDS.
absl::StatusOr<InjectedSlowRank> InjectedSlowRankOf();

struct InjectedNan {
  int64_t step = 0;  // 0: none
  int layer = 0;
  int tp_rank = 0;
};
// NF_INJECT_NAN's step, layer and tensor-parallel rank (step 0 when unset); InvalidArgument
// naming the variable when it is not STEP:LAYER:TP_RANK.
absl::StatusOr<InjectedNan> InjectedNanOf();

// NF_INJECT_ABSENT_RANK's world rank (-1 when unset); InvalidArgument naming the variable when
// it is not a rank.
absl::StatusOr<int> InjectedAbsentRankOf();

// Every NF_INJECT_* variable read and checked against the run before it starts: a rank beyond
// `world_size` (the job's ranks), a layer beyond model.num_layers or a tensor-parallel rank
// beyond parallel.tensor_parallel is InvalidArgument naming the variable, as a malformed value is
// (it would inject nothing, silently).
absl::Status CheckFaultInjection(const TrainConfig& config, int world_size);

}  // namespace nf::launcher
