#include "model/normformer_model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "core/status.h"
#include "model/vocab.h"
#include "parallel/local_communicator.h"
#include "parallel/topology.h"

namespace nf::model {
namespace {

ops::Activation ActivationOf(ModelConfig::Activation act) {
  switch (act) {
    case ModelConfig::GELU_TANH:
      return ops::Activation::kGeluTanh;
    case ModelConfig::RELU_SQUARED:
      return ops::Activation::kReluSquared;
    default:
      return ops::Activation::kGelu;
  }
}

// fairseq's sinusoidal table: for position p and i < d/2, sin(p w_i) in column i and
// cos(p w_i) in column d/2 + i, w_i = 10000^(-i / (d/2 - 1)); an odd d leaves a zero column.
// Positions count from 0 (fairseq offsets them past its padding index; the table is the same).
std::vector<float> SinusoidalTable(int64_t positions, int64_t d) {
  const int64_t half = d / 2;
  const double step = half > 1 ? std::log(10000.0) / static_cast<double>(half - 1) : 0.0;
  std::vector<float> table(positions * d, 0.0f);
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * std::exp(-step * static_cast<double>(i));
      table[p * d + i] = static_cast<float>(std::sin(angle));
      table[p * d + half + i] = static_cast<float>(std::cos(angle));
    }
  }
  return table;
}

}  // namespace

NormFormerModel::NormFormerModel(ModelConfig config, ModelOptions options,
                                 std::unique_ptr<parallel::Communicator> own_tp, ParamTable table)
    : config_(std::move(config)),
      options_(options),
      own_tp_(std::move(own_tp)),
      tp_(own_tp_ ? own_tp_.get() : options.tensor_parallel),
      table_(std::move(table)) {}

absl::StatusOr<std::unique_ptr<NormFormerModel>> NormFormerModel::Create(
    const ModelConfig& config, const ModelOptions& options) {
  if (config.d_model() % config.num_heads() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.d_model (", config.d_model(),
                                                   ") must be divisible by model.num_heads (",
                                                   config.num_heads(), ")"));
  }
  if (options.seq_len > config.max_seq_len()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence length ", options.seq_len, " exceeds model.max_seq_len ", config.max_seq_len()));
  }
  NF_ASSIGN_OR_RETURN(const PipelineStagePlacement placement,
                      ResolvePlacement(options.pipeline, config.num_layers()));
  std::unique_ptr<parallel::Communicator> own_tp;
  if (options.tensor_parallel == nullptr) {
    own_tp = std::make_unique<parallel::LocalCommunicator>("tp");
  }
  parallel::Communicator& tp = own_tp ? *own_tp : *options.tensor_parallel;
  NF_RETURN_IF_ERROR(
      parallel::CheckModelDivisibility(config.num_heads(), config.ffn_dim(), tp.size()));
  const int64_t padded_vocab = PaddedVocabSize(config.vocab_size(), tp.size());
  NF_ASSIGN_OR_RETURN(ParamTable table,
                      ParamTable::Create(NormFormerParamSpecs(config, padded_vocab, placement),
                                         options.dtype, tp.rank(), tp.size()));
  NF_RETURN_IF_ERROR(table.Initialize(options.seed));
  ModelOptions resolved = options;
  resolved.pipeline = placement;
  std::unique_ptr<NormFormerModel> model(
      new NormFormerModel(config, resolved, std::move(own_tp), std::move(table)));
  model->padded_vocab_ = padded_vocab;
  model->vocab_offset_ = tp.rank() * (padded_vocab / tp.size());
  model->params_ = BindModelParams(model->table_, config, placement);
  const NormFormerConfig& nf = config.normformer();
  const int64_t heads = config.num_heads() / tp.size(), ffn = config.ffn_dim() / tp.size();
  model->shape_ = {.batch = options.micro_batch,
                   .seq = options.seq_len,
                   .d_model = config.d_model(),
                   .heads = heads,
                   .head_dim = config.d_model() / config.num_heads(),
                   .ffn = ffn,
                   .ffn_total = config.ffn_dim(),
                   .head_offset = tp.rank() * heads,
                   .ffn_offset = tp.rank() * ffn,
                   .dtype = options.dtype};
  model->layer_options_ = {
      .activation = ActivationOf(config.activation()),
      .dropout = config.dropout(),
      .attention_dropout = config.attention_dropout(),
      .activation_dropout = config.activation_dropout(),
      .eps = config.layer_norm_eps(),
      .scale_attn = nf.scale_attn(),
      .scale_heads = nf.scale_heads(),
      .heads_before_out_proj = nf.head_scale_placement() == NormFormerConfig::BEFORE_OUT_PROJ,
      .scale_fc = nf.scale_fc(),
      .scale_resids = nf.scale_resids()};
  // Layers keep their global index: it keys their dropout sites.
  for (int l = placement.layer_begin; l < placement.layer_end; ++l) {
    model->layers_.emplace_back(l, model->params_.layers[l - placement.layer_begin], model->shape_,
                                model->layer_options_, model->tp_);
  }
  NF_RETURN_IF_ERROR(model->AllocateBuffers());
  return model;
}

absl::Status NormFormerModel::AllocateBuffers() {
  const int64_t t = shape_.tokens(), d = shape_.d_model;
  const DType dt = options_.dtype;
  hidden_.resize(layers_.size() + 1);
  for (Tensor& h : hidden_) {
    NF_ASSIGN_OR_RETURN(h, Tensor::Zeros(dt, {t, d}));
  }
  const size_t distinct = options_.activation_recompute ? 1 : layers_.size();
  for (size_t i = 0; i < distinct; ++i) {
    NF_ASSIGN_OR_RETURN(LayerActivations acts, LayerActivations::Allocate(shape_, layer_options_));
    layer_acts_.push_back(std::move(acts));
  }
  NF_ASSIGN_OR_RETURN(scratch_, LayerScratch::Allocate(shape_));
  if (placement().first() && config_.positions() == ModelConfig::SINUSOIDAL) {
    NF_ASSIGN_OR_RETURN(positions_, TensorFromFloats(dt, {config_.max_seq_len(), d},
                                                     SinusoidalTable(config_.max_seq_len(), d)));
  }
  if (placement().last()) NF_RETURN_IF_ERROR(AllocateHeadBuffers());
  NF_ASSIGN_OR_RETURN(grad_a_, Tensor::Zeros(dt, {t, d}));
  NF_ASSIGN_OR_RETURN(grad_b_, Tensor::Zeros(dt, {t, d}));
  return absl::OkStatus();
}

absl::Status NormFormerModel::AllocateHeadBuffers() {
  const int64_t t = shape_.tokens(), d = shape_.d_model;
  const DType dt = options_.dtype, f32 = DType::kF32;
  NF_ASSIGN_OR_RETURN(final_norm_, Tensor::Zeros(dt, {t, d}));
  NF_ASSIGN_OR_RETURN(final_mean_, Tensor::Zeros(f32, {t}));
  NF_ASSIGN_OR_RETURN(final_rstd_, Tensor::Zeros(f32, {t}));
  NF_ASSIGN_OR_RETURN(logits_, Tensor::Zeros(dt, {t, padded_vocab_ / tp_->size()}));
  for (Tensor* v : {&row_max_, &token_loss_, &dloss_}) {
    NF_ASSIGN_OR_RETURN(*v, Tensor::Zeros(f32, {t}));
  }
  NF_ASSIGN_OR_RETURN(loss_sums_, Tensor::Zeros(f32, {2, t}));
  NF_ASSIGN_OR_RETURN(sum_exp_, loss_sums_.View(0, {t}));
  NF_ASSIGN_OR_RETURN(target_logit_, loss_sums_.View(t, {t}));
  return absl::OkStatus();
}

absl::Status NormFormerModel::EmbedForward(const Tensor& ids, const DecoderLayer::Step& step) {
  const Tensor& x = hidden_[0];
  const int64_t d = shape_.d_model, seq = shape_.seq;
  NF_RETURN_IF_ERROR(ops::EmbeddingForward({.ids = ids,
                                            .table = params_.embed_tokens.value,
                                            .out = x,
                                            .vocab_offset = vocab_offset_,
                                            .global_vocab = config_.vocab_size()}));
  // Each rank looked up the ids of its vocabulary slice (zeros elsewhere): sum the slices.
  NF_RETURN_IF_ERROR(tp_->AllReduce(x, parallel::ReduceOp::kSum));
  if (config_.scale_embedding()) {
    NF_RETURN_IF_ERROR(ops::Scale(x, static_cast<float>(std::sqrt(static_cast<double>(d)))));
  }
  const Tensor& table =
      params_.embed_positions.defined() ? params_.embed_positions.value : positions_;
  NF_ASSIGN_OR_RETURN(const Tensor positions, table.Slice(0, seq));
  for (int64_t b = 0; b < shape_.batch; ++b) {  // every sample gets positions [0, seq)
    NF_ASSIGN_OR_RETURN(const Tensor sample, x.Slice(b * seq, seq));
    NF_RETURN_IF_ERROR(ops::Axpy(1.0f, positions, sample));
  }
  return ops::Dropout(x, x, EmbeddingDropout(step));
}

ops::DropoutSpec NormFormerModel::EmbeddingDropout(const DecoderLayer::Step& step) const {
  return {.p = step.train ? config_.dropout() : 0.0f,
          .seed = step.seed,
          .site = 0,
          .first_sample = step.first_sample,
          .seq_len = shape_.seq};
}

absl::Status NormFormerModel::CheckWholeModel(absl::string_view method) const {
  if (placement().num_stages == 1) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "NormFormerModel::", method, " runs the whole model, but this is pipeline stage ",
      placement().stage, " of ", placement().num_stages, ": use ", method, "Stage"));
}

absl::StatusOr<NormFormerModel::LossSum> NormFormerModel::Forward(const Tensor& inputs,
                                                                  const Tensor& targets,
                                                                  uint64_t first_sample,
                                                                  bool train) {
  NF_RETURN_IF_ERROR(CheckWholeModel("Forward"));
  NF_ASSIGN_OR_RETURN(const StageOutput out,
                      ForwardStage(&inputs, nullptr, targets, first_sample, train));
  return out.loss;
}

absl::Status NormFormerModel::Backward(float loss_weight) {
  NF_RETURN_IF_ERROR(CheckWholeModel("Backward"));
  return BackwardStage(nullptr, loss_weight);
}

absl::Status NormFormerModel::CheckStageInputs(const Tensor* input_ids, const Tensor* input_hidden,
                                               const Tensor& targets) const {
  const Shape expected{shape_.batch, shape_.seq};
  const auto check_ids = [&](absl::string_view what, const Tensor* ids) -> absl::Status {
    if (ids != nullptr && ids->shape() == expected && ids->dtype() == DType::kI32) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "NormFormerModel::ForwardStage: ", what, " ", ids ? ids->DebugString() : "(none)",
        " must be i32", ShapeToString(expected), " (micro_batch, seq_len)"));
  };
  if (placement().first()) {
    NF_RETURN_IF_ERROR(check_ids("inputs", input_ids));
  } else {
    NF_RETURN_IF_ERROR(CheckHiddenShape("input_hidden", input_hidden));
  }
  if (placement().last()) NF_RETURN_IF_ERROR(check_ids("targets", &targets));
  return absl::OkStatus();
}

absl::Status NormFormerModel::CheckHiddenShape(absl::string_view what, const Tensor* hidden) const {
  const Shape expected{shape_.tokens(), shape_.d_model};
  if (hidden != nullptr && hidden->shape() == expected && hidden->dtype() == options_.dtype) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "NormFormerModel: pipeline stage ", placement().stage, " of ", placement().num_stages,
      " needs ", what, " ", hidden ? hidden->DebugString() : "(none)", " as ",
      DTypeName(options_.dtype), ShapeToString(expected), " (micro_batch * seq_len, d_model)"));
}

absl::StatusOr<NormFormerModel::StageOutput> NormFormerModel::ForwardStage(
    const Tensor* input_ids, const Tensor* input_hidden, const Tensor& targets,
    uint64_t first_sample, bool train) {
  NF_RETURN_IF_ERROR(CheckStageInputs(input_ids, input_hidden, targets));
  const int64_t t = shape_.tokens();
  step_ = {.first_sample = first_sample, .seed = options_.seed, .train = train};
  if (placement().first()) {
    NF_ASSIGN_OR_RETURN(ids_, input_ids->Reshape({t}));
    NF_RETURN_IF_ERROR(EmbedForward(ids_, step_));
  } else {
    // Copied, not viewed: the sender's buffer may be reused (by the next micro-batch) while
    // this micro-batch's backward still needs its input.
    NF_RETURN_IF_ERROR(ops::Cast(*input_hidden, hidden_[0]));
  }
  NF_RETURN_IF_ERROR(LayersForward());
  if (!placement().last()) return StageOutput{.hidden = &hidden_.back()};
  NF_ASSIGN_OR_RETURN(targets_, targets.Reshape({t}));
  NF_ASSIGN_OR_RETURN(const LossSum loss, HeadForward());
  return StageOutput{.loss = loss};
}

absl::Status NormFormerModel::BackwardStage(const Tensor* output_grad, float loss_weight) {
  if (placement().last()) {
    NF_RETURN_IF_ERROR(HeadBackward(loss_weight));
  } else {
    NF_RETURN_IF_ERROR(CheckHiddenShape("output_grad", output_grad));
    NF_RETURN_IF_ERROR(ops::Cast(*output_grad, grad_a_));
  }
  NF_RETURN_IF_ERROR(LayersBackward());
  // grad_a_ now holds the gradient of the stage's input: input_grad() on later stages.
  if (placement().first()) return EmbedBackward(step_);
  return absl::OkStatus();
}

absl::Status NormFormerModel::LayersForward() {
  for (size_t l = 0; l < layers_.size(); ++l) {
    NF_RETURN_IF_ERROR(
        layers_[l].Forward(hidden_[l], hidden_[l + 1], step_, ActivationsOf(l), scratch_));
  }
  return absl::OkStatus();
}

// grad_a_ holds the gradient of the last layer's output on entry and of the first layer's input
// on return; each layer writes its input's gradient into grad_b_ and the two swap.
absl::Status NormFormerModel::LayersBackward() {
  for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
    LayerActivations& acts = ActivationsOf(l);
    if (options_.activation_recompute) {
      // Re-run the forward from the kept input; it rewrites hidden_[l + 1] with equal values.
      NF_RETURN_IF_ERROR(layers_[l].Forward(hidden_[l], hidden_[l + 1], step_, acts, scratch_));
    }
    NF_RETURN_IF_ERROR(layers_[l].Backward(hidden_[l], grad_a_, grad_b_, step_, acts, scratch_));
    std::swap(grad_a_, grad_b_);
  }
  return absl::OkStatus();
}

absl::StatusOr<NormFormerModel::LossSum> NormFormerModel::HeadForward() {
  NF_RETURN_IF_ERROR(ops::LayerNormForward({.x = hidden_.back(),
                                            .weight = params_.final_norm_weight.value,
                                            .bias = params_.final_norm_bias.value,
                                            .y = final_norm_,
                                            .mean = final_mean_,
                                            .rstd = final_rstd_,
                                            .eps = config_.layer_norm_eps()}));
  NF_RETURN_IF_ERROR(
      ops::Gemm({.a = final_norm_, .b = HeadWeight().value, .c = logits_, .trans_b = true}));
  // Vocab-parallel cross-entropy: the global row max, then the sums of exponentials against it
  // and the target logit (held by one slice, 0 elsewhere), all-reduced together.
  const ops::CrossEntropyArgs loss_args = LossArgs();
  NF_RETURN_IF_ERROR(ops::CrossEntropyRowMax(loss_args, row_max_));
  NF_RETURN_IF_ERROR(tp_->AllReduce(row_max_, parallel::ReduceOp::kMax));
  NF_RETURN_IF_ERROR(ops::CrossEntropySumExp(loss_args, row_max_, sum_exp_, target_logit_));
  NF_RETURN_IF_ERROR(tp_->AllReduce(loss_sums_, parallel::ReduceOp::kSum));
  NF_RETURN_IF_ERROR(
      ops::CrossEntropyLoss(targets_, row_max_, sum_exp_, target_logit_, token_loss_));
  LossSum loss;
  const float* per_token = token_loss_.data<float>();
  const int32_t* target = targets_.data<int32_t>();
  for (int64_t i = 0; i < shape_.tokens(); ++i) {
    if (target[i] < 0) continue;
    loss.sum += per_token[i];
    ++loss.tokens;
  }
  return loss;
}

// Leaves the gradient of the last layer's output in grad_a_.
absl::Status NormFormerModel::HeadBackward(float loss_weight) {
  NF_RETURN_IF_ERROR(ops::Fill(dloss_, loss_weight));
  // dlogits overwrite the logits: [T, V] is the largest activation, kept once.
  NF_RETURN_IF_ERROR(ops::CrossEntropyBackward(LossArgs(), row_max_, sum_exp_, dloss_, logits_));
  const Param& head = HeadWeight();
  NF_RETURN_IF_ERROR(
      ops::Gemm({.a = logits_, .b = final_norm_, .c = head.grad, .trans_a = true, .beta = 1.0f}));
  NF_RETURN_IF_ERROR(ops::Gemm({.a = logits_, .b = head.value, .c = grad_b_}));
  // The head is column-parallel over the vocabulary: sum the slices' input gradients.
  NF_RETURN_IF_ERROR(tp_->AllReduce(grad_b_, parallel::ReduceOp::kSum));
  return ops::LayerNormBackward({.dy = grad_b_,
                                 .x = hidden_.back(),
                                 .weight = params_.final_norm_weight.value,
                                 .mean = final_mean_,
                                 .rstd = final_rstd_,
                                 .dx = grad_a_,
                                 .dweight = params_.final_norm_weight.grad,
                                 .dbias = params_.final_norm_bias.grad});
}

absl::Status NormFormerModel::EmbedBackward(const DecoderLayer::Step& step) {
  const Tensor& dx = grad_a_;  // gradient of the embedding block's output
  const int64_t d = shape_.d_model, seq = shape_.seq;
  NF_RETURN_IF_ERROR(ops::Dropout(dx, dx, EmbeddingDropout(step)));
  if (params_.embed_positions.defined()) {
    NF_ASSIGN_OR_RETURN(const Tensor dpositions, params_.embed_positions.grad.Slice(0, seq));
    for (int64_t b = 0; b < shape_.batch; ++b) {
      NF_ASSIGN_OR_RETURN(const Tensor sample, dx.Slice(b * seq, seq));
      NF_RETURN_IF_ERROR(ops::Axpy(1.0f, sample, dpositions));
    }
  }
  if (config_.scale_embedding()) {
    NF_RETURN_IF_ERROR(ops::Scale(dx, static_cast<float>(std::sqrt(static_cast<double>(d)))));
  }
  return ops::EmbeddingBackward(ids_, dx, params_.embed_tokens.grad, vocab_offset_);
}

const Param& NormFormerModel::HeadWeight() const {
  return config_.tie_embeddings() ? params_.embed_tokens : params_.output_projection;
}

ops::CrossEntropyArgs NormFormerModel::LossArgs() const {
  return {.logits = logits_,
          .targets = targets_,
          .vocab_offset = vocab_offset_,
          .valid_vocab = config_.vocab_size()};
}

absl::StatusOr<double> NormFormerModel::OwnedSquaredGradNorm() const {
  const PipelineStagePlacement& p = options_.pipeline;
  const bool head_copy = config_.tie_embeddings() && p.last() && !p.first();
  return table_.OwnedSquaredGradNorm(head_copy
                                         ? std::vector<std::string>{"decoder.embed_tokens.weight"}
                                         : std::vector<std::string>{});
}

}  // namespace nf::model
