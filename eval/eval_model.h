// One evaluation rank's part of a checkpoint's model: its pipeline stage (layers split over the
// pipeline group as evenly as they go, one chunk per rank), sharded over its tensor-parallel
// group, with the checkpoint's parameters (any layout's checkpoint: resharded on load, no
// optimizer state), run forward without dropout one micro-batch at a time.
//
// Forward passes a micro-batch down the pipeline with blocking sends and receives: stage r
// receives stage r - 1's [T, d] output, runs, and sends its own to r + 1. Nothing overlaps (an
// evaluation is a small share of a training run's cost, and this keeps the order of every
// collective obvious); data-parallel replicas, when the world has more ranks than tp x pp,
// share the micro-batches instead.
//
// Scores come from the last stage's logits ([T, V_pad / tp], this rank's vocabulary slice):
// for each scored position the rows are read to the host, and the log-softmax of the target is
// formed in float64 from the global row maximum (a max all-reduce over tp), the sum of
// exponentials and the target's logit (one sum all-reduce over tp, the target held by one
// slice). Padded vocabulary rows are never part of it. The target counts as greedy when its
// logit equals the row maximum: the argmax, ties included.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"
#include "model/normformer_model.h"
#include "parallel/process_groups.h"

namespace nf::eval {

// Where one rank evaluates: its process groups (host values over MPI, or local groups of one)
// and the communicators for device tensors (NCCL on a multi-process GPU job, else the same
// groups). All must outlive the models.
struct EvalRank {
  const parallel::ProcessGroups* groups = nullptr;
  parallel::Communicator* device_tp = nullptr;
  parallel::Communicator* device_pp = nullptr;
  Device device = Device::Cpu();
};

// log P(target | the tokens before it), and whether the target is the most likely token.
struct TokenScore {
  double logprob = 0.0;
  bool greedy = false;
};

// This rank's pipeline stage of `config` (layers split over the pipeline group as evenly as they
// go), sharded over its tensor-parallel group, for micro-batches of `rows` sequences of `seq_len`
// tokens in `dtype`, without gradients (forwards only: no gradient or backward buffers) and
// with its parameters zero until the caller loads or copies them (checkpoint::LoadParameters
// fills every one or fails). nf-generate's models are made the same way.
absl::StatusOr<std::unique_ptr<model::NormFormerModel>> CreateStageModel(
    const model::ModelConfig& config, DType dtype, int64_t rows, int64_t seq_len,
    const EvalRank& rank);

class EvalModel {
 public:
  // This rank's stage of `config` for micro-batches of `rows` sequences of `seq_len` tokens in
  // `dtype`, parameters as initialised (Load or CopyParameters replaces them).
  static absl::StatusOr<std::unique_ptr<EvalModel>> Create(const model::ModelConfig& config,
                                                           DType dtype, int64_t rows,
                                                           int64_t seq_len, const EvalRank& rank);

  absl::Status Load(const std::filesystem::path& dir, const checkpoint::Manifest& manifest);
  // The parameters of a model of the same config and rank (its shapes of micro-batch may
  // differ): a copy of the flat parameter buffer.
  absl::Status CopyParameters(const EvalModel& from);

  int64_t rows() const { return rows_; }
  int64_t seq_len() const { return seq_len_; }
  bool last_stage() const { return model_->placement().last(); }

  // One micro-batch through the pipeline. inputs, targets: host i32 [rows, seq_len] (target -1:
  // no loss), the same on every rank of the pipeline (the first stage reads inputs, the last
  // targets). Collective over the pipeline and tensor-parallel groups.
  absl::Status Forward(const Tensor& inputs, const Tensor& targets);

  // After Forward, on the last stage: the score of targets[i] at position `position` + i of row
  // `row` (predicted from the row's tokens up to and including that position). Collective over
  // the tensor-parallel group.
  struct Span {
    int64_t row = 0;
    int64_t position = 0;
    std::vector<int32_t> targets;
  };
  absl::StatusOr<std::vector<std::vector<TokenScore>>> ScoreTokens(const std::vector<Span>& spans);

  // The loss sum and token count the last stage's forwards accumulated since the last call
  // (NormFormerModel::TakeLossSum); zero elsewhere.
  absl::StatusOr<model::NormFormerModel::LossSum> TakeLossSum() { return model_->TakeLossSum(); }

 private:
  EvalModel() = default;

  std::unique_ptr<model::NormFormerModel> model_;
  EvalRank rank_;
  int64_t rows_ = 0, seq_len_ = 0;
  Tensor received_;  // [rows * seq_len, d] on the device: the previous stage's output
};

}  // namespace nf::eval
