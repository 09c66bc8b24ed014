#include "model/normformer_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/ops/nonfinite_trace.h"
#include "core/ops/ops.h"
#include "core/status.h"
#include "model/linear.h"
#include "model/vocab.h"
#include "parallel/coalesced_all_reduce.h"
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

// fairseq's sinusoidal table for positions first .. first + rows - 1 ([rows, d], row r is
// position first + r): sin(p w_i) in column i and cos(p w_i) in column d/2 + i for i < d/2,
// w_i = 10000^(-i / (d/2 - 1)); an odd d leaves a zero column.
std::vector<float> SinusoidalTable(int64_t rows, int64_t first, int64_t d) {
  const int64_t half = d / 2;
  const double step = half > 1 ? std::log(10000.0) / static_cast<double>(half - 1) : 0.0;
  std::vector<float> table(rows * d, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const double p = static_cast<double>(first + r);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = p * std::exp(-step * static_cast<double>(i));
      table[r * d + i] = static_cast<float>(std::sin(angle));
      table[r * d + half + i] = static_cast<float>(std::cos(angle));
    }
  }
  return table;
}

// Calls fn(row, position, length) for each run of `rows` consecutive rows of a sample-major
// [batch * seq, d] tensor, starting at token first_token, that lies inside one sample: rows
// row .. row + length - 1 (counted from first_token) are that sample's positions
// position .. position + length - 1. A sequence-parallel shard may start and end mid-sample.
template <typename Fn>
absl::Status ForEachSampleRun(int64_t first_token, int64_t rows, int64_t seq, Fn&& fn) {
  for (int64_t row = 0; row < rows;) {
    const int64_t position = (first_token + row) % seq;
    const int64_t length = std::min(seq - position, rows - row);
    NF_RETURN_IF_ERROR(fn(row, position, length));
    row += length;
  }
  return absl::OkStatus();
}

}  // namespace

LayerShape LayerShapeOf(const ModelConfig& config, const ModelOptions& options, int tp_rank,
                        int tp_size) {
  const int64_t heads = config.num_heads() / tp_size, ffn = config.ffn_dim() / tp_size;
  const bool split_tokens = options.sequence_parallel && tp_size > 1;
  return {.batch = options.micro_batch,
          .seq = options.seq_len,
          .d_model = config.d_model(),
          .heads = heads,
          .head_dim = config.d_model() / config.num_heads(),
          .ffn = ffn,
          .ffn_total = config.ffn_dim(),
          .head_offset = tp_rank * heads,
          .ffn_offset = tp_rank * ffn,
          .dtype = options.dtype,
          .device = options.device,
          .sequence_shards = split_tokens ? tp_size : 1,
          .sequence_shard = split_tokens ? tp_rank : 0};
}

LayerOptions LayerOptionsOf(const ModelConfig& config, Recompute recompute) {
  const NormFormerConfig& nf = config.normformer();
  return {.activation = ActivationOf(config.activation()),
          .dropout = config.dropout(),
          .attention_dropout = config.attention_dropout(),
          .activation_dropout = config.activation_dropout(),
          .eps = config.layer_norm_eps(),
          .causal = config.objective() != ModelConfig::MASKED_LM,
          .scale_attn = nf.scale_attn(),
          .scale_heads = nf.scale_heads(),
          .heads_before_out_proj = nf.head_scale_placement() == NormFormerConfig::BEFORE_OUT_PROJ,
          .scale_fc = nf.scale_fc(),
          .scale_resids = nf.scale_resids(),
          .recompute_attention = recompute == Recompute::kSelective};
}

NormFormerModel::NormFormerModel(ModelConfig config, ModelOptions options,
                                 std::unique_ptr<parallel::Communicator> own_tp, ParamTable table)
    : config_(std::move(config)),
      options_(options),
      own_tp_(std::move(own_tp)),
      tp_(own_tp_ ? own_tp_.get() : options.tensor_parallel),
      region_(tp_, options.sequence_parallel && tp_->size() > 1,
              options.overlap_tensor_parallel_comm),
      table_(std::move(table)) {}

absl::StatusOr<std::unique_ptr<NormFormerModel>> NormFormerModel::Create(
    const ModelConfig& config, const ModelOptions& options) {
  if (config.d_model() % config.num_heads() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.d_model (", config.d_model(),
                                                   ") must be divisible by model.num_heads (",
                                                   config.num_heads(), ")"));
  }
  if (config.first_position() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.first_position must be >= 0 (got ", config.first_position(), ")"));
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
  if (options.sequence_parallel && (options.micro_batch * options.seq_len) % tp.size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.sequence_parallel splits each micro-batch's tokens over the tensor-parallel "
        "ranks: micro_batch_size x seq_len (",
        options.micro_batch, " x ", options.seq_len, ") must be a multiple of tensor_parallel (",
        tp.size(), ")"));
  }
  const int64_t padded_vocab = PaddedVocabSize(config.vocab_size(), tp.size());
  NF_ASSIGN_OR_RETURN(
      ParamTable table,
      ParamTable::Create(NormFormerParamSpecs(config, padded_vocab, placement), options.dtype,
                         tp.rank(), tp.size(), options.param_buffer_multiple, options.device,
                         options.gradients));
  if (options.initialize) NF_RETURN_IF_ERROR(table.Initialize(options.seed));
  ModelOptions resolved = options;
  resolved.pipeline = placement;
  std::unique_ptr<NormFormerModel> model(
      new NormFormerModel(config, resolved, std::move(own_tp), std::move(table)));
  model->padded_vocab_ = padded_vocab;
  model->vocab_offset_ = tp.rank() * (padded_vocab / tp.size());
  model->params_ = BindModelParams(model->table_, config, placement);
  model->shape_ = LayerShapeOf(config, options, tp.rank(), tp.size());
  model->layer_options_ = LayerOptionsOf(config, options.recompute);
  model->layer_options_.backward = options.gradients;
  // Layers keep their global index: it keys their dropout sites.
  for (int l = placement.layer_begin; l < placement.layer_end; ++l) {
    model->layers_.emplace_back(l, model->params_.layers[l - placement.layer_begin], model->shape_,
                                model->layer_options_, model->region_);
  }
  for (int l = placement.layer_begin; l < placement.layer_end; ++l) {
    model->layer_grad_offsets_.push_back(model->table_.LowestOffset(LayerPrefix(l) + "."));
  }
  if (placement.last()) {
    // The final LayerNorm comes first of the head's parameters (NormFormerParamSpecs), before
    // the masked LM's lm_head and an untied projection.
    model->head_grad_offset_ = model->table_.LowestOffset("decoder.layer_norm.");
  }
  NF_RETURN_IF_ERROR(model->AllocateBuffers());
  return model;
}

// Keep in step with AllocateInFlight.
int64_t NormFormerModel::InFlightBytes(const ModelConfig& config, const ModelOptions& options,
                                       int tp_size) {
  const LayerShape shape = LayerShapeOf(config, options, /*tp_rank=*/0, tp_size);
  LayerOptions layer_options = LayerOptionsOf(config, options.recompute);
  layer_options.backward = options.gradients;
  const PipelineStagePlacement& placement = options.pipeline;
  const int64_t s = static_cast<int64_t>(SizeOf(options.dtype));
  const int64_t t = shape.tokens(), ts = shape.shard_tokens(), d = shape.d_model;
  const int64_t layers = (placement.layer_end == -1 ? config.num_layers() : placement.layer_end) -
                         placement.layer_begin;
  int64_t bytes = (layers + 1) * ts * d * s;  // hidden
  if (options.recompute != Recompute::kFull && options.gradients) {
    bytes += layers * LayerActivations::Bytes(shape, layer_options);
  }
  if (placement.first()) bytes += t * 4;  // ids
  if (!placement.last()) return bytes;
  const int64_t padded_vocab = PaddedVocabSize(config.vocab_size(), tp_size);
  // targets, final_norm and its statistics, logits, row_max, token_loss, loss_sums
  bytes += t * 4 + ts * d * s + ts * 2 * 4 + t * (padded_vocab / tp_size) * s + t * 4 * 4;
  if (config.objective() == ModelConfig::MASKED_LM) bytes += 2 * ts * d * s + ts * 2 * 4;
  return bytes;
}

// Keep in step with AllocateBuffers.
int64_t NormFormerModel::BufferBytes(const ModelConfig& config, const ModelOptions& options,
                                     int tp_size) {
  const LayerShape shape = LayerShapeOf(config, options, /*tp_rank=*/0, tp_size);
  LayerOptions layer_options = LayerOptionsOf(config, options.recompute);
  layer_options.backward = options.gradients;
  const int64_t s = static_cast<int64_t>(SizeOf(options.dtype));
  int64_t bytes = LayerScratch::Bytes(shape, layer_options);
  if (options.recompute == Recompute::kFull || !options.gradients) {
    bytes += LayerActivations::Bytes(shape, layer_options);
  }
  if (options.pipeline.first() && config.positions() == ModelConfig::SINUSOIDAL) {
    bytes += config.max_seq_len() * config.d_model() * s;
  }
  if (options.pipeline.last()) bytes += 2 * 8;  // loss_totals_
  if (!options.gradients) return bytes;
  if (options.pipeline.last()) bytes += shape.tokens() * 4;     // dloss_
  return bytes + 2 * shape.shard_tokens() * shape.d_model * s;  // grad_a_, grad_b_
}

// Keep in step with BufferBytes.
absl::Status NormFormerModel::AllocateBuffers() {
  const int64_t t = shape_.tokens(), d = shape_.d_model;
  const DType dt = options_.dtype;
  if (shares_activations()) {
    NF_ASSIGN_OR_RETURN(shared_acts_, LayerActivations::Allocate(shape_, layer_options_));
  }
  NF_ASSIGN_OR_RETURN(scratch_, LayerScratch::Allocate(shape_, layer_options_));
  if (placement().first() && config_.positions() == ModelConfig::SINUSOIDAL) {
    // Only the rows a sequence uses: row t is position t + first_position.
    NF_ASSIGN_OR_RETURN(
        const Tensor table,
        TensorFromFloats(dt, {config_.max_seq_len(), d},
                         SinusoidalTable(config_.max_seq_len(), config_.first_position(), d)));
    NF_ASSIGN_OR_RETURN(positions_, Zeros(dt, table.shape()));
    NF_RETURN_IF_ERROR(ops::Copy(table, positions_));
  }
  if (placement().last()) {
    NF_ASSIGN_OR_RETURN(loss_totals_, Zeros(DType::kF64, {2}));
  }
  if (!options_.gradients) return absl::OkStatus();
  if (placement().last()) {
    NF_ASSIGN_OR_RETURN(dloss_, Zeros(DType::kF32, {t}));
  }
  NF_ASSIGN_OR_RETURN(grad_a_, Zeros(dt, hidden_shape()));
  NF_ASSIGN_OR_RETURN(grad_b_, Zeros(dt, hidden_shape()));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NormFormerModel::InFlight>> NormFormerModel::AllocateInFlight()
    const {
  const int64_t t = shape_.tokens(), ts = shape_.shard_tokens(), d = shape_.d_model;
  const DType dt = options_.dtype, f32 = DType::kF32;
  auto mb = std::make_unique<InFlight>();
  mb->hidden.resize(layers_.size() + 1);
  for (Tensor& h : mb->hidden) {
    NF_ASSIGN_OR_RETURN(h, Zeros(dt, hidden_shape()));
  }
  if (!shares_activations()) {
    for (size_t l = 0; l < layers_.size(); ++l) {
      NF_ASSIGN_OR_RETURN(LayerActivations acts,
                          LayerActivations::Allocate(shape_, layer_options_));
      mb->layers.push_back(std::move(acts));
    }
  }
  if (placement().first()) {
    NF_ASSIGN_OR_RETURN(mb->ids, Zeros(DType::kI32, {t}));
  }
  if (!placement().last()) return mb;
  NF_ASSIGN_OR_RETURN(mb->targets, Zeros(DType::kI32, {t}));
  NF_ASSIGN_OR_RETURN(mb->final_norm, Zeros(dt, {ts, d}));
  NF_ASSIGN_OR_RETURN(mb->logits, Zeros(dt, {t, padded_vocab_ / tp_->size()}));
  for (Tensor* v : {&mb->final_mean, &mb->final_rstd}) {
    NF_ASSIGN_OR_RETURN(*v, Zeros(f32, {ts}));
  }
  for (Tensor* v : {&mb->row_max, &mb->token_loss}) {
    NF_ASSIGN_OR_RETURN(*v, Zeros(f32, {t}));
  }
  NF_ASSIGN_OR_RETURN(mb->loss_sums, Zeros(f32, {2, t}));
  NF_ASSIGN_OR_RETURN(mb->sum_exp, mb->loss_sums.View(0, {t}));
  NF_ASSIGN_OR_RETURN(mb->target_logit, mb->loss_sums.View(t, {t}));
  if (masked_lm()) {
    for (Tensor* v : {&mb->head_dense, &mb->head_norm}) {
      NF_ASSIGN_OR_RETURN(*v, Zeros(dt, {ts, d}));
    }
    for (Tensor* v : {&mb->head_mean, &mb->head_rstd}) {
      NF_ASSIGN_OR_RETURN(*v, Zeros(f32, {ts}));
    }
  }
  return mb;
}

absl::StatusOr<NormFormerModel::InFlight*> NormFormerModel::Acquire(int micro_batch) {
  if (auto it = in_flight_.find(micro_batch); it != in_flight_.end()) return it->second.get();
  std::unique_ptr<InFlight> mb;
  if (pool_.empty()) {
    NF_ASSIGN_OR_RETURN(mb, AllocateInFlight());
  } else {
    mb = std::move(pool_.back());
    pool_.pop_back();
  }
  InFlight* acquired = mb.get();
  in_flight_.emplace(micro_batch, std::move(mb));
  peak_in_flight_ = std::max(peak_in_flight_, in_flight());
  return acquired;
}

absl::Status NormFormerModel::EmbedForward(InFlight& mb, int64_t first_token) {
  const ops::OpLabel label("embedding");
  const Tensor& x = mb.hidden[0];  // [Ts, d]
  const int64_t d = shape_.d_model;
  // Each rank looks up the ids of its vocabulary slice (zeros elsewhere) for all T tokens; the
  // slices' sum is this rank's rows.
  const Tensor& lookup = region_.PartialsFor(x, scratch_.region.partials);
  NF_RETURN_IF_ERROR(ops::EmbeddingForward({.ids = mb.ids,
                                            .table = params_.embed_tokens.value,
                                            .out = lookup,
                                            .vocab_offset = vocab_offset_,
                                            .global_vocab = config_.vocab_size()}));
  NF_RETURN_IF_ERROR(region_.Leave(lookup, x));
  if (config_.scale_embedding()) {
    NF_RETURN_IF_ERROR(ops::Scale(x, static_cast<float>(std::sqrt(static_cast<double>(d)))));
  }
  // Token t of every sample gets position first_token + t + first_position: the learned table's
  // row of that number, or the sinusoidal table's row first_token + t (which starts at
  // first_position).
  const Tensor& table =
      params_.embed_positions.defined() ? params_.embed_positions.value : positions_;
  const int64_t first_row =
      (params_.embed_positions.defined() ? config_.first_position() : 0) + first_token;
  NF_RETURN_IF_ERROR(ForEachSampleRun(
      shape_.first_token(), shape_.shard_tokens(), shape_.seq,
      [&](int64_t row, int64_t position, int64_t length) -> absl::Status {
        NF_ASSIGN_OR_RETURN(const Tensor positions, table.Slice(first_row + position, length));
        NF_ASSIGN_OR_RETURN(const Tensor rows, x.Slice(row, length));
        return ops::Axpy(1.0f, positions, rows);
      }));
  return ops::Dropout(x, x, EmbeddingDropout(mb.step));
}

ops::DropoutSpec NormFormerModel::EmbeddingDropout(const DecoderLayer::Step& step) const {
  return {.p = step.train ? config_.dropout() : 0.0f,
          .seed = step.seed,
          .site = 0,
          .first_sample = step.first_sample,
          .seq_len = shape_.seq,
          .token_offset = shape_.first_token()};
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
  NF_RETURN_IF_ERROR(ForwardStage(0, &inputs, nullptr, targets, first_sample, train).status());
  return TakeLossSum();
}

absl::Status NormFormerModel::Backward(float loss_weight) {
  NF_RETURN_IF_ERROR(CheckWholeModel("Backward"));
  return BackwardStage(0, nullptr, loss_weight);
}

absl::Status NormFormerModel::CheckStageInputs(const Tensor* input_ids, const Tensor* input_hidden,
                                               const Tensor* targets) const {
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
  if (placement().last() && targets != nullptr) NF_RETURN_IF_ERROR(check_ids("targets", targets));
  return absl::OkStatus();
}

absl::Status NormFormerModel::CheckHiddenShape(absl::string_view what, const Tensor* hidden) const {
  const Shape expected = hidden_shape();
  if (hidden != nullptr && hidden->shape() == expected && hidden->dtype() == options_.dtype) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "NormFormerModel: pipeline stage ", placement().stage, " of ", placement().num_stages,
      " needs ", what, " ", hidden ? hidden->DebugString() : "(none)", " as ",
      DTypeName(options_.dtype), ShapeToString(expected),
      region_.sequence_parallel() ? " (micro_batch * seq_len / tensor_parallel, d_model)"
                                  : " (micro_batch * seq_len, d_model)"));
}

absl::StatusOr<const Tensor*> NormFormerModel::ForwardStage(int micro_batch,
                                                            const Tensor* input_ids,
                                                            const Tensor* input_hidden,
                                                            const Tensor& targets,
                                                            uint64_t first_sample, bool train) {
  NF_RETURN_IF_ERROR(CheckStageInputs(input_ids, input_hidden, &targets));
  NF_ASSIGN_OR_RETURN(InFlight* const mb, Acquire(micro_batch));
  const int64_t t = shape_.tokens();
  mb->step = {.first_sample = first_sample, .seed = options_.seed, .train = train};
  if (placement().first()) {
    NF_ASSIGN_OR_RETURN(const Tensor ids, input_ids->Reshape({t}));
    NF_RETURN_IF_ERROR(ops::Copy(ids, mb->ids));
    NF_RETURN_IF_ERROR(EmbedForward(*mb));
  } else {
    NF_RETURN_IF_ERROR(ops::Copy(*input_hidden, mb->hidden[0]));
  }
  NF_RETURN_IF_ERROR(LayersForward(*mb));
  if (!placement().last()) return &mb->hidden.back();
  NF_ASSIGN_OR_RETURN(const Tensor target_ids, targets.Reshape({t}));
  NF_RETURN_IF_ERROR(ops::Copy(target_ids, mb->targets));
  last_forward_ = mb;
  NF_RETURN_IF_ERROR(HeadForward(*mb));
  return nullptr;
}

absl::StatusOr<NormFormerModel::LossSum> NormFormerModel::TakeLossSum() {
  if (!placement().last()) return LossSum{};
  // On the CPU, OnHost is the tensor itself: read before resetting.
  NF_ASSIGN_OR_RETURN(const Tensor totals, ops::OnHost(loss_totals_));
  const LossSum taken{.sum = totals.data<double>()[0],
                      .tokens = static_cast<int64_t>(totals.data<double>()[1])};
  NF_RETURN_IF_ERROR(ops::Fill(loss_totals_, 0.0f));
  return taken;
}

absl::Status NormFormerModel::BackwardStage(int micro_batch, const Tensor* output_grad,
                                            float loss_weight,
                                            const GradsDoneFrom& grads_done_from) {
  if (!options_.gradients) {
    return absl::FailedPreconditionError(
        "NormFormerModel::BackwardStage: this model was made without gradients "
        "(ModelOptions::gradients false: it runs forwards only)");
  }
  const auto it = in_flight_.find(micro_batch);
  if (it == in_flight_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("NormFormerModel::BackwardStage: micro-batch ", micro_batch,
                     " is not in flight on pipeline stage ", placement().stage,
                     " (no ForwardStage, or its backward already ran)"));
  }
  InFlight& mb = *it->second;
  if (placement().last()) {
    NF_RETURN_IF_ERROR(HeadBackward(mb, loss_weight));
    if (grads_done_from) NF_RETURN_IF_ERROR(grads_done_from(head_grad_offset_));
  } else {
    NF_RETURN_IF_ERROR(CheckHiddenShape("output_grad", output_grad));
    NF_RETURN_IF_ERROR(ops::Copy(*output_grad, grad_a_));
  }
  NF_RETURN_IF_ERROR(LayersBackward(mb, grads_done_from));
  // grad_a_ now holds the gradient of the stage's input: input_grad() on later stages.
  if (placement().first()) NF_RETURN_IF_ERROR(EmbedBackward(mb));
  if (grads_done_from) NF_RETURN_IF_ERROR(grads_done_from(0));
  pool_.push_back(std::move(it->second));
  in_flight_.erase(it);
  return absl::OkStatus();
}

void NormFormerModel::DiscardForward(int micro_batch) {
  const auto it = in_flight_.find(micro_batch);
  if (it == in_flight_.end()) return;
  pool_.push_back(std::move(it->second));
  in_flight_.erase(it);
}

absl::Status NormFormerModel::LayersForward(InFlight& mb, bool use_kv_cache) {
  for (size_t l = 0; l < layers_.size(); ++l) {
    const absl::Status status = layers_[l].Forward(mb.hidden[l], mb.hidden[l + 1], mb.step,
                                                   ActivationsOf(mb, static_cast<int>(l)), scratch_,
                                                   use_kv_cache ? &kv_caches_[l] : nullptr);
    if (!status.ok()) {
      return WithContext(status, absl::StrCat("decoder layer ", layers_[l].index(), " forward"));
    }
  }
  return absl::OkStatus();
}

// grad_a_ holds the gradient of the last layer's output on entry and of the first layer's input
// on return; each layer writes its input's gradient into grad_b_ and the two swap.
absl::Status NormFormerModel::LayersBackward(InFlight& mb, const GradsDoneFrom& grads_done_from) {
  for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
    LayerActivations& acts = ActivationsOf(mb, l);
    absl::Status status;
    if (full_recompute()) {
      // Re-run the forward from the kept input; it rewrites hidden[l + 1] with equal values.
      status = layers_[l].Forward(mb.hidden[l], mb.hidden[l + 1], mb.step, acts, scratch_);
    }
    if (status.ok()) {
      status = layers_[l].Backward(mb.hidden[l], grad_a_, grad_b_, mb.step, acts, scratch_);
    }
    if (!status.ok()) {
      return WithContext(status, absl::StrCat("decoder layer ", layers_[l].index(), " backward"));
    }
    std::swap(grad_a_, grad_b_);
    if (grads_done_from) NF_RETURN_IF_ERROR(grads_done_from(layer_grad_offsets_[l]));
  }
  return absl::OkStatus();
}

absl::Status NormFormerModel::LogitsForward(InFlight& mb) {
  ops::OpLabel label("final_norm");
  NF_RETURN_IF_ERROR(ops::LayerNormForward({.x = mb.hidden.back(),
                                            .weight = params_.final_norm_weight.value,
                                            .bias = params_.final_norm_bias.value,
                                            .y = mb.final_norm,
                                            .mean = mb.final_mean,
                                            .rstd = mb.final_rstd,
                                            .eps = config_.layer_norm_eps()}));
  if (masked_lm()) {
    // RoBERTa's transform, on this rank's rows: [Ts, d] -> dense -> act -> LayerNorm.
    label.Rename("lm_head");
    NF_RETURN_IF_ERROR(LinearForward(mb.final_norm, params_.lm_head_dense_weight,
                                     params_.lm_head_dense_bias, mb.head_dense));
    NF_RETURN_IF_ERROR(ops::ActivationNormForward({.act = layer_options_.activation,
                                                   .dropout = {},  // RoBERTa's head has none
                                                   .x = mb.head_dense,
                                                   .weight = params_.lm_head_norm_weight.value,
                                                   .bias = params_.lm_head_norm_bias.value,
                                                   .y = mb.head_norm,
                                                   .mean = mb.head_mean,
                                                   .rstd = mb.head_rstd,
                                                   .scratch = scratch_.model_width[0],
                                                   .eps = config_.layer_norm_eps()}));
  }
  label.Rename("logits");
  NF_ASSIGN_OR_RETURN(const Tensor features,
                      region_.Enter(ProjectionInput(mb), scratch_.region.gathered));
  // [T, V_pad / tp] = [T, d] [V_pad / tp, d]^T (+ the masked LM's bias slice).
  return ops::Gemm({.a = features,
                    .b = HeadWeight().value,
                    .c = mb.logits,
                    .trans_b = true,
                    .bias = params_.lm_head_bias.value});
}

absl::Status NormFormerModel::HeadForward(InFlight& mb) {
  NF_RETURN_IF_ERROR(LogitsForward(mb));
  // Vocab-parallel cross-entropy: the global row max, then the sums of exponentials against it
  // and the target logit (held by one slice, 0 elsewhere), all-reduced together.
  const ops::OpLabel label("loss");
  const ops::CrossEntropyArgs loss_args = LossArgs(mb);
  NF_RETURN_IF_ERROR(ops::CrossEntropyRowMax(loss_args, mb.row_max));
  NF_RETURN_IF_ERROR(tp_->AllReduce(mb.row_max, parallel::ReduceOp::kMax));
  NF_RETURN_IF_ERROR(ops::CrossEntropySumExp(loss_args, mb.row_max, mb.sum_exp, mb.target_logit));
  NF_RETURN_IF_ERROR(tp_->AllReduce(mb.loss_sums, parallel::ReduceOp::kSum));
  NF_RETURN_IF_ERROR(
      ops::CrossEntropyLoss(mb.targets, mb.row_max, mb.sum_exp, mb.target_logit, mb.token_loss));
  // Summed on the device: nothing here waits for the micro-batch's kernels.
  return ops::AccumulateLoss(mb.token_loss, mb.targets, loss_totals_);
}

// Leaves the gradient of the last layer's output in grad_a_.
absl::Status NormFormerModel::HeadBackward(InFlight& mb, float loss_weight) {
  ops::OpLabel label("loss");
  NF_RETURN_IF_ERROR(ops::Fill(dloss_, loss_weight));
  // dlogits overwrite the logits: [T, V] is the largest activation, kept once.
  NF_RETURN_IF_ERROR(
      ops::CrossEntropyBackward(LossArgs(mb), mb.row_max, mb.sum_exp, dloss_, mb.logits));
  label.Rename("logits");
  const Param& head = HeadWeight();
  if (params_.lm_head_bias.defined()) {
    NF_RETURN_IF_ERROR(ops::BiasBackward(mb.logits, params_.lm_head_bias.grad));
  }
  // Gathered again under sequence parallelism: later forwards reused the forward's buffer.
  NF_ASSIGN_OR_RETURN(const Tensor features,
                      region_.Enter(ProjectionInput(mb), scratch_.region.gathered));
  NF_RETURN_IF_ERROR(
      ops::Gemm({.a = mb.logits, .b = features, .c = head.grad, .trans_a = true, .beta = 1.0f}));
  // The head is column-parallel over the vocabulary: sum the slices' input gradients.
  const Tensor& partials = region_.PartialsFor(grad_b_, scratch_.region.partials);
  NF_RETURN_IF_ERROR(ops::Gemm({.a = mb.logits, .b = head.value, .c = partials}));
  NF_RETURN_IF_ERROR(region_.Leave(partials, grad_b_));
  if (masked_lm()) {
    // grad_b_ [Ts, d] is the transform's output gradient; back through its LayerNorm and
    // activation into d_dense, then the dense layer back into grad_b_ (the final LayerNorm's
    // output gradient).
    label.Rename("lm_head");
    const Tensor& d_dense = scratch_.model_width[1];
    NF_RETURN_IF_ERROR(ops::ActivationNormBackward({.act = layer_options_.activation,
                                                    .dropout = {},
                                                    .dy = grad_b_,
                                                    .x = mb.head_dense,
                                                    .weight = params_.lm_head_norm_weight.value,
                                                    .mean = mb.head_mean,
                                                    .rstd = mb.head_rstd,
                                                    .dx = d_dense,
                                                    .dweight = params_.lm_head_norm_weight.grad,
                                                    .dbias = params_.lm_head_norm_bias.grad,
                                                    .scratch = scratch_.model_width[0]}));
    NF_RETURN_IF_ERROR(LinearBackward(mb.final_norm, params_.lm_head_dense_weight,
                                      params_.lm_head_dense_bias, d_dense, grad_b_,
                                      /*accumulate_dx=*/false));
  }
  label.Rename("final_norm");
  return ops::LayerNormBackward({.dy = grad_b_,
                                 .x = mb.hidden.back(),
                                 .weight = params_.final_norm_weight.value,
                                 .mean = mb.final_mean,
                                 .rstd = mb.final_rstd,
                                 .dx = grad_a_,
                                 .dweight = params_.final_norm_weight.grad,
                                 .dbias = params_.final_norm_bias.grad});
}

absl::Status NormFormerModel::EmbedBackward(InFlight& mb) {
  const ops::OpLabel label("embedding");
  const Tensor& dx = grad_a_;  // [Ts, d]: gradient of the embedding block's output
  const int64_t d = shape_.d_model;
  NF_RETURN_IF_ERROR(ops::Dropout(dx, dx, EmbeddingDropout(mb.step)));
  if (params_.embed_positions.defined()) {
    const Tensor& dtable = params_.embed_positions.grad;
    NF_RETURN_IF_ERROR(ForEachSampleRun(
        shape_.first_token(), shape_.shard_tokens(), shape_.seq,
        [&](int64_t row, int64_t position, int64_t length) -> absl::Status {
          NF_ASSIGN_OR_RETURN(const Tensor dpositions,
                              dtable.Slice(config_.first_position() + position, length));
          NF_ASSIGN_OR_RETURN(const Tensor rows, dx.Slice(row, length));
          return ops::Axpy(1.0f, rows, dpositions);
        }));
  }
  if (config_.scale_embedding()) {
    NF_RETURN_IF_ERROR(ops::Scale(dx, static_cast<float>(std::sqrt(static_cast<double>(d)))));
  }
  // Every token's gradient, for this rank's vocabulary rows.
  NF_ASSIGN_OR_RETURN(const Tensor all_tokens, region_.Enter(dx, scratch_.region.gathered));
  return ops::EmbeddingBackward(mb.ids, all_tokens, params_.embed_tokens.grad, vocab_offset_);
}

const Tensor& NormFormerModel::ProjectionInput(const InFlight& mb) const {
  return masked_lm() ? mb.head_norm : mb.final_norm;
}

const Param& NormFormerModel::HeadWeight() const {
  return config_.tie_embeddings() ? params_.embed_tokens : params_.output_projection;
}

ops::CrossEntropyArgs NormFormerModel::LossArgs(const InFlight& mb) const {
  return {.logits = mb.logits,
          .targets = mb.targets,
          .vocab_offset = vocab_offset_,
          .valid_vocab = config_.vocab_size()};
}

// The last stage's tied head is a copy of the first stage's embedding: the first counts it.
std::vector<std::string> NormFormerModel::CopiesOfOtherStages() const {
  const PipelineStagePlacement& p = options_.pipeline;
  if (config_.tie_embeddings() && p.last() && !p.first()) return {"decoder.embed_tokens.weight"};
  return {};
}

absl::StatusOr<double> NormFormerModel::OwnedSquaredGradNorm() const {
  return table_.OwnedSquaredGradNorm(CopiesOfOtherStages());
}

std::vector<optim::FlatRange> NormFormerModel::SequenceParallelGradRanges() const {
  std::vector<optim::FlatRange> ranges;
  if (!region_.sequence_parallel()) return ranges;
  for (const ParamTable::Entry& e : table_.entries()) {
    if (e.spec.sharding == Sharding::kReplicated) {
      ranges.push_back({.offset = e.offset, .length = e.grad.numel()});
    }
  }
  return ranges;
}

absl::Status NormFormerModel::ReduceSequenceParallelGrads() {
  std::vector<Tensor> grads;
  for (const optim::FlatRange& r : SequenceParallelGradRanges()) {
    NF_ASSIGN_OR_RETURN(Tensor grad, table_.grads().Slice(r.offset, r.length));
    grads.push_back(std::move(grad));
  }
  return parallel::AllReduceCoalesced(grads, *tp_);
}

std::vector<optim::FlatRange> NormFormerModel::OwnedNormRanges() const {
  return table_.OwnedNormRanges(CopiesOfOtherStages());
}

std::map<int, std::vector<optim::FlatRange>> NormFormerModel::OwnedNormRangesByBlock() const {
  std::map<int, std::vector<optim::FlatRange>> blocks;
  for (const ParamTable::Entry* e : table_.OwnedNormEntries(CopiesOfOtherStages())) {
    blocks[BlockOf(e->spec.name, config_.num_layers())].push_back(
        {.offset = e->offset, .length = e->grad.numel()});
  }
  return blocks;
}

}  // namespace nf::model
