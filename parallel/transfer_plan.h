// How a pipeline rank issues its schedule's transfers so that they cannot deadlock under
// NCCL's rules, and a unit-time model of those rules to prove it.
//
// NCCL's rules (what the model, and the test double tests/parallel/nccl_rules_communicator.h,
// enforce). A rank's operations on one communicator run strictly in issue order: an operation,
// or a group of them issued together (ncclGroupStart/End), starts only when everything issued
// before it has completed. A send completes only when its receive has started on the peer (for
// messages above NCCL's internal buffers, which a 2.7B activation is), a receive when its send
// has started, and a group when all of its operations have. So a send issued alone blocks every
// later operation of its rank until the peer posts the receive, and two ranks that each send
// before receiving wait for each other for ever, although MPI would run them.
//
// The plan. Every rank builds all ranks' schedules (BuildAllSchedules) and runs them on the
// unit-time simulator with buffered sends: each message gets the time it is sent in the ideal
// run, its *round*. A rank then issues
//   - each send right after the computation that produced it, with round = its send time;
//   - each receive at the last point between two of its computations (a *boundary*) whose time
//     in the ideal run is at or before its message's round, so never later than the schedule
//     places it and possibly earlier (receives posted ahead, as in Megatron-LM's interleaved
//     schedule), with the round of its message;
//   - at each boundary, one group per round among its transfers, in increasing round order.
// Both ends of a message carry the same round, and along every rank the rounds only grow. So
// by induction on rounds nothing can deadlock: once every group of the rounds before t has
// completed, every rank can issue its round-t group (it waits only for operations of earlier
// groups), and the two ends of every round-t message are then both running. And since a
// receive is posted no later than its send in the ideal run, no send waits for its receiver:
// with the ideal run's compute times the model's step time is the ideal one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "parallel/pipeline_schedule.h"

namespace nf::parallel {

// One step of a rank's plan: a computation, or a group of transfers issued as one unit.
struct PlanStep {
  // A computation (kForward, kBackward), or the group's transfers (sends first, then receives;
  // at most one send, the output of the computation just before).
  std::vector<Action> actions;
  int64_t round = -1;  // a group's round; -1 for a computation

  bool is_compute() const { return actions.size() == 1 && actions[0].is_compute(); }
};

// The compute times the plan's ideal run assumes: a backward costs about twice a forward.
inline constexpr int64_t kPlanForwardTime = 1, kPlanBackwardTime = 2;

// The plan of every rank for `schedules` (all ranks' lists, indexed by rank: BuildAllSchedules
// or BuildAllForwardOnlySchedules), by the rule above. Each rank's plan holds its list's
// computations in order and each of its transfers exactly once. Refuses lists that do not pair
// up (CheckSchedulePairing).
absl::StatusOr<std::vector<std::vector<PlanStep>>> BuildTransferPlans(
    absl::Span<const std::vector<Action>> schedules);

struct NcclRulesOptions {
  int64_t forward_time = kPlanForwardTime;
  int64_t backward_time = kPlanBackwardTime;
  // Per rank, the send window PipelineExecutor keeps (SendWindow): before issuing a group with
  // a send while this many sends are pending, the rank waits for the oldest.
  std::vector<int> send_windows;
};

// Runs every rank's plan under NCCL's rules in the unit-time model: a rank's host runs its
// steps in order, issuing each group to its communicator at once and waiting only where
// PipelineExecutor waits (for a computation's received input; for the activation send of a
// micro-batch before its backward on the chunk; for the oldest send when its window is full;
// for all its sends at the end). Each communicator runs its groups strictly in issue order,
// and a group completes when every transfer in it has its other end started. Transfers take
// no time. Returns the times as SimulateSchedules does (done_at empty), or FailedPrecondition
// on a deadlock, naming what every stuck rank and its communicator wait for.
absl::StatusOr<SimulationResult> SimulateUnderNcclRules(
    absl::Span<const std::vector<PlanStep>> plans, const NcclRulesOptions& options);

// "forward mb 0 chunk 0" or "group [send_activation mb 0 chunk 0 to rank 1, ...] (round 3)".
std::string PlanStepToString(const PlanStep& step);

}  // namespace nf::parallel
