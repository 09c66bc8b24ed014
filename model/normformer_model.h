// The NormFormer language model on one tensor-parallel rank (or on one rank alone): token
// embedding (scaled by sqrt(d_model)),
// sinusoidal or learned positions, embedding dropout, the decoder layers, the final
// LayerNorm, the LM head (tied to the embedding by default) and the cross-entropy loss over
// the real vocabulary (padding rows are never predicted). Under tensor parallelism the
// embedding and LM head hold a vocabulary slice (vocab-parallel embedding and cross-entropy),
// the layers their heads and ffn columns (model/tensor_parallel.h); everything else, and the
// loss, is replicated.
//
// Forward runs one micro-batch and keeps what Backward needs; Backward accumulates fp32
// parameter gradients into the ParamTable. With activation recompute, only each layer's
// input is kept and its Forward re-runs inside Backward: less memory, bit-identical results
// (dropout masks are recomputed from the same Philox coordinates).
//
// Under pipeline parallelism the object is one stage (ModelOptions::pipeline): a contiguous
// range of layers under their global names and dropout sites, the embedding on the first
// stage, the final LayerNorm, head and loss on the last. ForwardStage / BackwardStage pass
// [T, d] hidden states and their gradients between stages; Forward / Backward are the
// one-stage case. A stage keeps the activations of one micro-batch: ForwardStage overwrites
// what the previous one kept, so each forward must be followed by its backward before the next
// forward (the multi-micro-batch pipeline executor will hold several in flight).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/decoder_layer.h"
#include "model/model_config.pb.h"
#include "model/normformer_params.h"
#include "model/param_table.h"
#include "parallel/communicator.h"

namespace nf::model {

struct ModelOptions {
  DType dtype = DType::kF32;  // parameters and activations
  int64_t micro_batch = 1;
  int64_t seq_len = 1;
  bool activation_recompute = false;
  uint32_t seed = 1;  // initialisation and dropout
  // The tensor-parallel group (must outlive the model); null: no tensor parallelism.
  parallel::Communicator* tensor_parallel = nullptr;
  // The pipeline stage this object is; the default is the whole model.
  PipelineStagePlacement pipeline = {};
};

class NormFormerModel {
 public:
  static absl::StatusOr<std::unique_ptr<NormFormerModel>> Create(const ModelConfig& config,
                                                                 const ModelOptions& options);

  // inputs, targets: i32 [micro_batch, seq_len] (target -1: no loss for that position).
  // first_sample: global index of the micro-batch's first sample (keys its dropout masks).
  // Returns the sum of the token losses and the number of tokens that carry a loss.
  struct LossSum {
    double sum = 0.0;
    int64_t tokens = 0;
  };
  // Refuses a model that is not the whole model (a pipeline stage): use ForwardStage.
  absl::StatusOr<LossSum> Forward(const Tensor& inputs, const Tensor& targets,
                                  uint64_t first_sample, bool train);

  // Gradients of sum(token losses) * loss_weight, accumulated into params().grads(). The
  // caller passes loss_weight = loss_scale / (tokens in the global batch).
  absl::Status Backward(float loss_weight);

  // What a stage's forward produces: the last stage's loss, or the output hidden state of any
  // other stage ([T, d] in the model dtype, owned by the model, valid until the next
  // ForwardStage).
  struct StageOutput {
    const Tensor* hidden = nullptr;  // non-last stages
    LossSum loss = {};               // the last stage
  };
  // One micro-batch through this stage. The first stage reads input_ids (i32 [micro_batch,
  // seq_len]); the others read input_hidden ([T = micro_batch * seq_len, d], model dtype,
  // copied). The last stage reads targets as Forward does; the others ignore them.
  absl::StatusOr<StageOutput> ForwardStage(const Tensor* input_ids, const Tensor* input_hidden,
                                           const Tensor& targets, uint64_t first_sample,
                                           bool train);
  // Backward through the micro-batch of the last ForwardStage. The last stage starts from the
  // loss scaled by loss_weight (as Backward); the others from output_grad, the gradient of their
  // output hidden state ([T, d], model dtype). Parameter gradients accumulate into
  // params().grads(); a non-first stage leaves the gradient of its input in input_grad().
  absl::Status BackwardStage(const Tensor* output_grad, float loss_weight);
  // [T, d]: the gradient of the last BackwardStage's input hidden state (non-first stages),
  // valid until the next BackwardStage.
  const Tensor& input_grad() const { return grad_a_; }

  // The resolved placement (layer_end set).
  const PipelineStagePlacement& placement() const { return options_.pipeline; }
  // Parameters whose gradients must be all-reduced over the embedding group (first and last
  // stages) before the optimizer step: see EmbeddingGroupParams.
  std::vector<std::string> embedding_group_params() const {
    return EmbeddingGroupParams(config_, options_.pipeline);
  }

  // This rank's share of the global squared gradient norm (ParamTable::OwnedSquaredGradNorm):
  // tensor-parallel duplicates count on tp rank 0, and a tied head copy on the last stage not at
  // all (the first stage counts the embedding). Call it after the embedding-group all-reduce,
  // which makes both copies' gradients the full one.
  absl::StatusOr<double> OwnedSquaredGradNorm() const;

  ParamTable& params() { return table_; }
  const ModelParams& model_params() const { return params_; }
  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  int64_t padded_vocab() const { return padded_vocab_; }
  // This rank's vocabulary slice [vocab_offset(), vocab_offset() + padded_vocab() / tp).
  int64_t vocab_offset() const { return vocab_offset_; }
  parallel::Communicator& tensor_parallel() { return *tp_; }
  // [tokens, padded_vocab / tp] logits of this rank's vocabulary slice from the last Forward
  // (overwritten by Backward).
  const Tensor& logits() const { return logits_; }

 private:
  NormFormerModel(ModelConfig config, ModelOptions options,
                  std::unique_ptr<parallel::Communicator> own_tp, ParamTable table);
  absl::Status AllocateBuffers();
  absl::Status AllocateHeadBuffers();
  absl::Status CheckWholeModel(absl::string_view method) const;
  absl::Status CheckStageInputs(const Tensor* input_ids, const Tensor* input_hidden,
                                const Tensor& targets) const;
  absl::Status CheckHiddenShape(absl::string_view what, const Tensor* hidden) const;
  absl::Status LayersForward();
  absl::Status LayersBackward();
  absl::StatusOr<LossSum> HeadForward();
  absl::Status HeadBackward(float loss_weight);
  absl::Status EmbedForward(const Tensor& ids, const DecoderLayer::Step& step);
  absl::Status EmbedBackward(const DecoderLayer::Step& step);
  ops::DropoutSpec EmbeddingDropout(const DecoderLayer::Step& step) const;
  const Param& HeadWeight() const;  // the embedding when tied, else output_projection
  ops::CrossEntropyArgs LossArgs() const;
  // `layer` counts from the stage's first layer.
  LayerActivations& ActivationsOf(int layer) {
    return layer_acts_[options_.activation_recompute ? 0 : layer];
  }

  ModelConfig config_;
  ModelOptions options_;
  std::unique_ptr<parallel::Communicator> own_tp_;  // the group of one, without tensor parallelism
  parallel::Communicator* tp_ = nullptr;
  ParamTable table_;
  ModelParams params_;
  int64_t padded_vocab_ = 0;
  int64_t vocab_offset_ = 0;
  LayerShape shape_;
  LayerOptions layer_options_;
  std::vector<DecoderLayer> layers_;  // the stage's layers

  // Buffers, allocated once. hidden_[l] is the stage's layer l's input (hidden_[0] the stage's
  // input), hidden_.back() the last output.
  std::vector<Tensor> hidden_;                // [T, d] x (stage layers + 1)
  std::vector<LayerActivations> layer_acts_;  // one per layer, or one shared with recompute
  LayerScratch scratch_;
  // The first stage's sinusoidal table and the last stage's head and loss buffers; undefined
  // on other stages.
  Tensor positions_;                             // [max_seq_len, d] sinusoidal table (model dtype)
  Tensor final_norm_, final_mean_, final_rstd_;  // [T, d], [T], [T]
  Tensor logits_;                                // [T, V_pad]; holds dlogits after Backward
  Tensor row_max_, token_loss_, dloss_;          // [T] fp32
  // [2, T] fp32: the sums of exponentials and target logits, all-reduced together.
  Tensor loss_sums_, sum_exp_, target_logit_;
  Tensor grad_a_, grad_b_;  // [T, d] residual-stream gradients
  // The last Forward's batch (ids on the first stage, targets on the last).
  Tensor ids_, targets_;  // [T] i32 views
  DecoderLayer::Step step_;
};

}  // namespace nf::model
