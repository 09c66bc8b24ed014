// Runs one training step's pipeline schedule (parallel/pipeline_schedule.h) on this pipeline
// rank: its model chunks' forwards and backwards, in the schedule's order, with activations
// and gradients exchanged over the pipeline group. Receives are blocking and placed by the
// schedule right before the computation that needs them; sends are non-blocking, their buffers
// kept until the send completes, which is what lets every rank's list run without deadlock
// (CheckSchedulePairing and SimulateSchedules prove it for each schedule). Messages between two
// ranks match in order on one tag, as the pairing check guarantees.
//
// Micro-batch i of this data-parallel rank is micro-batch first_micro_batch + i of the global
// batch: the first stage loads its ids, the last stage its targets, and every stage keys its
// dropout masks by its first global sample, so any layout draws the single rank's masks.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "launcher/batch_source.h"
#include "model/normformer_model.h"
#include "parallel/communicator.h"
#include "parallel/pipeline_schedule.h"

namespace nf::launcher {

struct PipelineStep {
  int64_t step = 0;               // 0-based
  int64_t first_micro_batch = 0;  // of this data-parallel rank, in the global batch
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 1;
  float loss_weight = 1.0f;  // loss_scale / tokens in the global batch
};

class PipelineExecutor {
 public:
  // chunks[c] is this rank's model chunk c (model stage c * p + pipeline rank); `pp` the
  // pipeline group (a group of one without pipelining); both must outlive the executor.
  // Builds this rank's schedule, refusing invalid combinations with BuildSchedule's advice.
  static absl::StatusOr<PipelineExecutor> Create(std::vector<model::NormFormerModel*> chunks,
                                                 parallel::Communicator& pp,
                                                 parallel::ScheduleKind kind, int micro_batches);

  // Called for chunk c during the backward of its last micro-batch of the step, when its
  // gradients are final from an offset up (NormFormerModel::GradsDoneFrom).
  using GradsDoneFn = std::function<absl::Status(int chunk, int64_t offset)>;

  struct Result {
    double data_seconds = 0.0;           // spent in BatchSource::Load
    double pipeline_wait_seconds = 0.0;  // waited for the pipeline's sends and receives
  };
  // Runs the schedule once. The last model stage's losses accumulate in its chunk
  // (NormFormerModel::TakeLossSum).
  absl::StatusOr<Result> Run(const PipelineStep& step, BatchSource& batches,
                             const GradsDoneFn& grads_done);

  const std::vector<parallel::Action>& schedule() const { return schedule_; }

 private:
  PipelineExecutor(std::vector<model::NormFormerModel*> chunks, parallel::Communicator& pp,
                   std::vector<parallel::Action> schedule)
      : chunks_(std::move(chunks)), pp_(&pp), schedule_(std::move(schedule)) {}

  struct PendingSend {
    parallel::Action action;
    Tensor buffer;  // owned by the send until it completes (gradients), or a view (activations)
    std::unique_ptr<parallel::CommHandle> handle;
  };
  bool IsFirstStage(int chunk) const;
  bool IsLastStage(int chunk) const;
  absl::Status WaitActivationSend(int micro_batch, int chunk);

  std::vector<model::NormFormerModel*> chunks_;
  parallel::Communicator* pp_;
  std::vector<parallel::Action> schedule_;
  Tensor received_;  // [T, d]: the last received activation or gradient
  // Forward outputs not sent yet, by (micro-batch, chunk).
  absl::flat_hash_map<std::pair<int, int>, Tensor> outputs_;
  std::vector<Tensor> grad_pool_;   // [T, d] send buffers for input gradients, reused
  std::vector<PendingSend> sends_;  // in flight
};

}  // namespace nf::launcher
