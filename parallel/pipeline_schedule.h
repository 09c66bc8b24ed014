// Pipeline-parallel schedules as data: the ordered list of computations and point-to-point
// transfers each pipeline rank runs in one training step, after Megatron-LM's schedules (GPipe,
// 1F1B, interleaved 1F1B). Pure logic, no communication: an executor runs its rank's list
// through a transfer plan (transfer_plan.h), which groups the transfers for NCCL. Building every
// rank's list in one process lets the checker and the unit-time simulator below prove, before
// any job starts, that the lists pair up and cannot deadlock under MPI's rules, and measure
// their bubble.
//
// Model stages. The model's layers are cut into p * v contiguous stages (v = virtual_stages, 1
// unless interleaved). Model stage s runs on pipeline rank s % p as that rank's model chunk
// s / p (Megatron's virtual pipeline layout: rank r holds stages r, r + p, r + 2p, ...), so the
// next stage of (rank r, chunk c) is on rank (r + 1) % p, chunk c + 1 when r is the last rank.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace nf::parallel {

enum class ScheduleKind {
  kGPipe,                // all forwards, then all backwards: m micro-batches in flight
  kOneFOneB,             // warm-up forwards, then one forward one backward: <= p in flight
  kInterleavedOneFOneB,  // 1F1B over v chunks per rank: the bubble shrinks by v
};

// "GPIPE", "ONE_F_ONE_B", "INTERLEAVED_ONE_F_ONE_B": the names refusals advise.
absl::string_view ScheduleKindName(ScheduleKind kind);

struct Action {
  enum Kind { kForward, kBackward, kSendActivation, kRecvActivation, kSendGrad, kRecvGrad };
  Kind kind = kForward;
  int micro_batch = 0;
  // This rank's chunk that computes (forward, backward), produced the message (send) or
  // consumes it (receive); 0 unless interleaved.
  int model_chunk = 0;
  // The pipeline rank sent to or received from; -1 for computations.
  int peer = -1;

  bool is_compute() const { return kind == kForward || kind == kBackward; }
  bool is_send() const { return kind == kSendActivation || kind == kSendGrad; }
  bool is_recv() const { return kind == kRecvActivation || kind == kRecvGrad; }

  // "forward mb 3 chunk 1", "send_activation mb 3 chunk 1 to rank 2",
  // "recv_grad mb 0 chunk 0 from rank 1".
  std::string ToString() const;

  friend bool operator==(const Action&, const Action&) = default;
};

// The actions pipeline rank `pipeline_rank` of `pipeline_size` runs for `micro_batches`
// micro-batches, in order. Every forward is preceded by the receive of its input activation
// (except on model stage 0) and followed by the send of its output (except on the last model
// stage); every backward is preceded by the receive of its output gradient (except on the last
// stage) and followed by the send of its input gradient (except on stage 0). Receives come
// immediately before the computation that needs them (with blocking receives, the latest
// position is the one that can never deadlock when an earlier one would not); PipelineExecutor
// posts them earlier, as its transfer plan says (transfer_plan.h).
//   kGPipe: forwards 0 .. m-1, then backwards m-1 .. 0.
//   kOneFOneB: min(p - r - 1, m) warm-up forwards, then alternately one forward and one
//     backward, then the remaining backwards, all in micro-batch order.
//   kInterleavedOneFOneB: m * v forward and m * v backward steps; step k is micro-batch
//     (k / (p v)) p + k % p on chunk (k % (p v)) / p (backwards: v - 1 minus that), i.e.
//     micro-batches in rounds of p through every chunk; min((p - r - 1) 2 + (v - 1) p, m v)
//     warm-up forward steps, then one forward and one backward step, then the rest.
// Refuses, in one line saying what would work: pipeline_size < 1, a rank out of range,
// micro_batches < 1, virtual_stages < 1, virtual_stages != 1 unless interleaved, and for
// interleaving virtual_stages 1, pipeline_size 1 or micro-batches not a multiple of p.
absl::StatusOr<std::vector<Action>> BuildSchedule(ScheduleKind kind, int pipeline_size,
                                                  int pipeline_rank, int micro_batches,
                                                  int virtual_stages = 1);

// BuildSchedule for every rank 0 .. pipeline_size - 1, indexed by rank.
absl::StatusOr<std::vector<std::vector<Action>>> BuildAllSchedules(ScheduleKind kind,
                                                                   int pipeline_size,
                                                                   int micro_batches,
                                                                   int virtual_stages = 1);

// Evaluation's schedule: forwards only, every micro-batch through the model stages in order,
// in rounds of p micro-batches as interleaved 1F1B orders its forwards. For each round (micro-
// batches k p .. min(k p + p, m) - 1), chunk 0 .. v-1, and micro-batch of the round: the receive
// of its input (except on model stage 0), the forward, the send of its output (except on the
// last stage). Any m works; v > 1 needs p >= 2 (one rank would send to itself). With v > 1 a
// round's first micro-batch comes back to rank 0 for the next chunk just as rank 0 finishes the
// round's last one, so the step takes m v + p - 1 chunk forwards when p divides m (taking each
// micro-batch through all chunks first took p v per micro-batch: 287 against 47 at p 16, m 16,
// v 2). It cannot deadlock: ordering the (round, chunk, micro-batch, stage) keys, every forward
// needs only the forward of a smaller key (stage s - 1, same micro-batch), and every rank does
// its forwards in increasing key order; CheckSchedulePairing and SimulateSchedules confirm it.
absl::StatusOr<std::vector<Action>> BuildForwardOnlySchedule(int pipeline_size, int pipeline_rank,
                                                             int micro_batches,
                                                             int virtual_stages = 1);
absl::StatusOr<std::vector<std::vector<Action>>> BuildAllForwardOnlySchedules(
    int pipeline_size, int micro_batches, int virtual_stages = 1);

// How many sends PipelineExecutor keeps pending on rank `pipeline_rank` of a training schedule
// (SimulationOptions::send_windows): before issuing a send while this many are pending it
// waits for the oldest, so its send buffers are bounded by the pipeline's depth, never by the
// number of micro-batches. The window is the most micro-batches 1F1B keeps in flight on the
// rank, p - r (GPipe, which holds all m activations anyway, gets the same), and for
// interleaving its most (micro-batch, chunk) activations in flight, (p - r - 1) 2 + (v - 1) p
// + 1 (ignoring the cap at m v). Evaluation's forward-only schedule uses a window of 1
// (kForwardOnlySendWindow): a stage keeps its output until the send completes, so one send
// pending means at most two outputs held. tests/parallel/pipeline_schedule_test.cc proves, for
// every small (kind, p, m, v), that the lists run to completion with these waits under
// rendezvous transfers (a send completes only once received) and that every rank finishes
// exactly when it does without any wait: the waits never hold a rank up in the unit-time model.
// (A window of 1 deadlocks interleaved schedules: the same test shows it.)
int SendWindow(ScheduleKind kind, int pipeline_size, int pipeline_rank, int virtual_stages = 1);
// SendWindow of every rank, indexed by rank.
std::vector<int> SendWindows(ScheduleKind kind, int pipeline_size, int virtual_stages = 1);
inline constexpr int kForwardOnlySendWindow = 1;

// Checks that the lists of all ranks (indexed by rank; p = their number) pair up: every send
// names the rank of the next (activation) or previous (gradient) model stage as its peer, every
// receive the rank its input comes from, and on every ordered pair of ranks the messages one
// sends, activations and gradients together, are exactly the messages the other receives, in
// the same order. That is what lets an executor use one tag per pair and still have each
// receive match the right send. The error names the first mismatch.
absl::Status CheckSchedulePairing(absl::Span<const std::vector<Action>> schedules);

struct SimulationOptions {
  int64_t forward_time = 1;
  int64_t backward_time = 1;
  // How sends complete. Empty: a send never holds its rank up (the transfer is buffered by
  // the other side). Otherwise one window k >= 1 per rank: transfers are rendezvous, a send
  // completing only once its receiver has received it (the worst case of MPI and NCCL for
  // large messages), and each rank waits for its sends as PipelineExecutor does: before issuing
  // a send while k of its sends are pending, for the oldest; before the backward of a
  // micro-batch on a chunk, for that chunk's send of the micro-batch's activation (the buffer
  // is the activation); at the end of its list, for all. A wait for a message its receiver
  // never reaches is a deadlock.
  std::vector<int> send_windows = {};
};

struct SimulationResult {
  std::vector<int64_t> busy;    // per rank: time spent computing
  std::vector<int64_t> finish;  // per rank: when its last action completed
  int64_t makespan = 0;         // the latest finish
  // Idle share of all ranks' time up to the makespan: 1 - sum(busy) / (p * makespan).
  double idle_fraction = 0.0;
  // Per rank: the most sends issued and not yet waited for at once (without send_windows
  // none is waited for: the rank's number of sends).
  std::vector<int> peak_pending_sends;
  // Per rank, per action of its list: when it completed (a computation's end, a send's issue,
  // a receive's arrival). BuildTransferPlan places its groups by these times.
  std::vector<std::vector<int64_t>> done_at;
};

// Runs the lists of all ranks (indexed by rank) on a unit-time model: a forward takes
// forward_time, a backward backward_time, sends and transfers take no time, and each rank runs
// its list in order, blocking on a receive until the matching send has happened (messages
// between a pair of ranks match in send order, as CheckSchedulePairing requires) and, with
// send_windows, on its waits for its sends. Returns FailedPrecondition on a deadlock (naming
// every blocked rank and what it waits for), on a receive that does not match the next message
// from its peer, or on messages left unreceived.
absl::StatusOr<SimulationResult> SimulateSchedules(absl::Span<const std::vector<Action>> schedules,
                                                   SimulationOptions options = {});

// Refuses a model whose num_layers does not split into pipeline_size * virtual_stages equal
// stages, listing the stage counts that would work (the divisors of num_layers above 1).
absl::Status CheckLayerSplit(int num_layers, int pipeline_size, int virtual_stages = 1);

// The layers [begin, end) of each model stage s = chunk * p + rank, contiguous and in order:
// equal when CheckLayerSplit passes, otherwise the first num_layers % (p v) stages hold one
// layer more.
std::vector<std::pair<int, int>> StageLayers(int num_layers, int pipeline_size,
                                             int virtual_stages = 1);

// The same for an explicit split: layers_per_stage[s] layers on model stage s. Refuses a split
// with other than p * v entries, an entry below 1, or a sum other than num_layers.
absl::StatusOr<std::vector<std::pair<int, int>>> StageLayers(
    int num_layers, int pipeline_size, int virtual_stages, absl::Span<const int> layers_per_stage);

}  // namespace nf::parallel
