// Runs this pipeline rank's part of a pipeline schedule (parallel/pipeline_schedule.h): a
// training step's forwards and backwards (Run), or evaluation's forwards only (RunForwardOnly),
// of its model chunks in the schedule's order, with activations and gradients exchanged over
// the pipeline group. One walker for both, so training and evaluation place, send and wait alike.
//
// Transfers. The executor runs its rank's transfer plan (parallel/transfer_plan.h): between
// two computations it starts each group of the plan as one batch (Communicator::StartBatch:
// one NCCL group), sends right after the computation that produced them and receives posted
// ahead, and before a computation it waits for the receive of its input. That arrangement is
// what keeps every schedule free of deadlock under NCCL's rules, where a lone send blocks its
// rank's later transfers until the peer receives (transfer_plan_test proves it in the
// unit-time model up to 16 stages; pipeline_nccl_rules_test runs this executor on the
// NCCL-rules test double). Messages between two ranks match in order on one tag, as
// CheckSchedulePairing guarantees. A receive lands in a buffer of its chunk's pool, returned
// once the computation has read it. A send's buffer stays untouched until the send is
// waited for: an activation send's is the chunk's output (a view of the activations the chunk
// keeps until that micro-batch's backward, or, in evaluation, until the send completes, when
// the forward is discarded), a gradient send's a copy of the chunk's input gradient in a
// pooled buffer.
//
// Bounded sends. The executor waits for its sends as the schedule goes, not only at its end:
// before issuing a send while SendWindow(kind, p, r, v) sends are pending (kForwardOnlySendWindow
// in evaluation), it waits for the oldest; before a micro-batch's backward on a chunk, for that
// chunk's activation send of it; at the end, for all. So a rank holds at most a window of send
// buffers, p - r under 1F1B, whatever the number of micro-batches, and the gradient pool never
// grows beyond it. Waiting for a send means waiting until the peer has reached its receive;
// SimulateSchedules models exactly these waits under rendezvous transfers, and
// pipeline_schedule_test proves them deadlock-free for every small layout, without delaying any
// rank in the unit-time model.
//
// Devices. Every buffer the executor allocates (the receive buffer, gradient send buffers) is
// on its chunk's device (PipelineStage::Zeros: ops::Zeros on the model's device), as NCCL
// requires. Errors of an action name it: "stage 2 forward of micro-batch 5: ...".
//
// Micro-batch i of this data-parallel rank is micro-batch first_micro_batch + i of the global
// batch: the first stage loads its ids, the last stage its targets, and every stage keys its
// dropout masks by its first global sample, so any layout draws the single rank's masks.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "launcher/batch_source.h"
#include "launcher/pipeline_stage.h"
#include "model/normformer_model.h"
#include "parallel/communicator.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/transfer_plan.h"

namespace nf::launcher {

struct PipelineStep {
  int64_t step = 0;               // 0-based, for messages
  int64_t batch_start = 0;        // stream index of the global batch's first sample
  int64_t first_micro_batch = 0;  // of this data-parallel rank, in the global batch
  int64_t micro_batch_size = 1;
  float loss_weight = 1.0f;  // loss_scale / tokens in the global batch
};

class PipelineExecutor {
 public:
  // stages[c] is this rank's model chunk c (model stage c * p + pipeline rank); `pp` the
  // pipeline group (a group of one without pipelining); both must outlive the executor.
  // Builds this rank's training schedule and its forward-only schedule, refusing invalid
  // combinations with BuildSchedule's advice, and allocates each chunk's receive buffer.
  static absl::StatusOr<PipelineExecutor> Create(std::vector<PipelineStage*> stages,
                                                 parallel::Communicator& pp,
                                                 parallel::ScheduleKind kind, int micro_batches);
  // The same for model chunks, each wrapped in a ModelStage the executor owns.
  static absl::StatusOr<PipelineExecutor> Create(std::vector<model::NormFormerModel*> chunks,
                                                 parallel::Communicator& pp,
                                                 parallel::ScheduleKind kind, int micro_batches);

  // Called for chunk c during the backward of its last micro-batch of the step, when its
  // gradients are final from an offset up (NormFormerModel::GradsDoneFrom).
  using GradsDoneFn = std::function<absl::Status(int chunk, int64_t offset)>;

  // Told of each computation as it starts and ends: the NaN-origin re-run (nan_origin.h) opens
  // a pass of its search for each.
  class ComputeObserver {
   public:
    virtual ~ComputeObserver() = default;
    // `compute` is a forward or backward of model stage `stage`.
    virtual void Started(const parallel::Action& compute, int stage) = 0;
    virtual void Finished(const parallel::Action& compute, int stage) = 0;
  };

  struct Result {
    double data_seconds = 0.0;           // spent in BatchSource::Load
    double pipeline_wait_seconds = 0.0;  // waited for the pipeline's sends and receives
    // The most sends pending at once during the run, and their bytes (activation views and
    // gradient buffers alike): bounded by the send window, not by the micro-batches.
    int peak_live_sends = 0;
    int64_t peak_send_bytes = 0;
    // Gradient send buffers allocated so far (the pool and those in flight).
    int send_buffers = 0;
    // Receive buffers allocated so far, over all chunks (the pools and those in flight).
    int recv_buffers = 0;
  };
  // Runs the training schedule once (forward with dropout, backward). The last model stage's
  // losses accumulate in its chunk (NormFormerModel::TakeLossSum). `observer`, when given, is
  // told of every computation.
  absl::StatusOr<Result> Run(const PipelineStep& step, BatchSource& batches,
                             const GradsDoneFn& grads_done, ComputeObserver* observer = nullptr);
  // Runs the forward-only schedule once: every micro-batch's forward without dropout
  // (train = false), its activations discarded once its output has been sent; losses
  // accumulate as in Run. step.loss_weight is unused.
  absl::StatusOr<Result> RunForwardOnly(const PipelineStep& step, BatchSource& batches);

  // What the latest Run or RunForwardOnly returned.
  const Result& last_result() const { return last_result_; }

  const std::vector<parallel::Action>& schedule() const { return schedule_; }
  const std::vector<parallel::Action>& forward_only_schedule() const { return forward_only_; }
  const std::vector<parallel::PlanStep>& plan() const { return plan_; }
  const std::vector<parallel::PlanStep>& forward_only_plan() const { return forward_only_plan_; }
  int send_window() const { return window_; }

 private:
  PipelineExecutor(std::vector<PipelineStage*> stages, parallel::Communicator& pp)
      : stages_(std::move(stages)), pp_(&pp) {}

  struct PendingSend {
    parallel::Action action;
    Tensor buffer;  // a pooled gradient buffer, or the chunk's output (a view)
    std::unique_ptr<parallel::CommHandle> handle;
  };
  // A receive started and not yet read: its buffer (from the chunk's pool) and handle.
  struct PendingRecv {
    parallel::Action action;
    Tensor buffer;
    std::unique_ptr<parallel::CommHandle> handle;
  };
  // Runs `plan` with at most `window` sends pending; forwards with `train`, and no backward in
  // the plan unless train.
  absl::StatusOr<Result> RunPlan(const std::vector<parallel::PlanStep>& plan, int window,
                                 bool train, const PipelineStep& step, BatchSource& batches,
                                 const GradsDoneFn& grads_done, ComputeObserver* observer);
  // Starts one group of the plan: its send (after the window's waits) and its receives.
  absl::Status StartGroup(const parallel::PlanStep& group, int window, bool train, Result& result);
  // Waits for the receive of `compute`'s input, if it has one, and hands it over; its buffer
  // goes back to the chunk's pool once the computation has read it.
  absl::StatusOr<std::optional<PendingRecv>> TakeInput(const parallel::Action& compute);
  absl::Status RunCompute(const parallel::Action& a, bool train, const PipelineStep& step,
                          BatchSource& batches, const GradsDoneFn& grads_done,
                          std::vector<int>& backwards_left, const Tensor* input, Result& result);
  // Waits for the pending send at `index` and releases its buffer: a gradient buffer back to
  // the pool; in evaluation, the forward an activation send read.
  absl::Status CompleteSend(size_t index, bool train);
  // Waits for the oldest pending sends until fewer than `window` are pending.
  absl::Status CompleteSendsAbove(int window, bool train);
  // A [T, d] buffer on `stage`'s device from `pool`, or newly allocated (counted in
  // `allocated`).
  absl::StatusOr<Tensor> PooledBuffer(const PipelineStage& stage, std::vector<Tensor>& pool,
                                      int& allocated);
  // "stage 2 forward of micro-batch 5: " + the status's message, its code kept.
  absl::Status Annotate(const absl::Status& status, const parallel::Action& a) const;

  std::vector<std::unique_ptr<PipelineStage>> owned_;  // ModelStage adapters, when made for models
  std::vector<PipelineStage*> stages_;
  parallel::Communicator* pp_;
  std::vector<parallel::Action> schedule_;
  std::vector<parallel::Action> forward_only_;
  std::vector<parallel::PlanStep> plan_;               // of schedule_
  std::vector<parallel::PlanStep> forward_only_plan_;  // of forward_only_
  int window_ = 1;                                     // SendWindow of the training schedule
  // Per chunk, [T, d] receive buffers on its device, free for reuse.
  std::vector<std::vector<Tensor>> recv_pool_;
  int recv_buffers_ = 0;  // allocated: free ones plus those in flight
  // Receives started and not yet read, by (activation?, micro-batch, chunk).
  std::map<std::tuple<bool, int, int>, PendingRecv> recvs_;
  // Forward outputs not sent yet, by (micro-batch, chunk).
  absl::flat_hash_map<std::pair<int, int>, Tensor> outputs_;
  std::vector<Tensor> grad_pool_;  // [T, d] gradient send buffers, free for reuse
  int grad_buffers_ = 0;           // allocated: free ones plus those in flight
  std::deque<PendingSend> sends_;  // pending, oldest first
  int64_t live_send_bytes_ = 0;
  Result last_result_;
};

}  // namespace nf::launcher
