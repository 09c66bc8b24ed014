#include "eval/eval_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "checkpoint/load_parameters.h"
#include "core/ops/ops.h"
#include "core/status.h"
#include "parallel/pipeline_schedule.h"

namespace nf::eval {

absl::StatusOr<std::unique_ptr<model::NormFormerModel>> CreateStageModel(
    const model::ModelConfig& config, DType dtype, int64_t rows, int64_t seq_len,
    const EvalRank& rank) {
  const parallel::Topology& topology = rank.groups->topology;
  const int stages = topology.pp();
  if (stages > config.num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline parallel ", stages, " exceeds the ",
                                                   config.num_layers(), " layers of the model"));
  }
  const auto [layer_begin, layer_end] =
      parallel::StageLayers(config.num_layers(), stages)[topology.pp_rank()];
  return model::NormFormerModel::Create(config, {.dtype = dtype,
                                                 .micro_batch = rows,
                                                 .seq_len = seq_len,
                                                 .device = rank.device,
                                                 .tensor_parallel = rank.device_tp,
                                                 .pipeline = {.stage = topology.pp_rank(),
                                                              .num_stages = stages,
                                                              .layer_begin = layer_begin,
                                                              .layer_end = layer_end},
                                                 .gradients = false,
                                                 .initialize = false});
}

absl::StatusOr<std::unique_ptr<EvalModel>> EvalModel::Create(const model::ModelConfig& config,
                                                             DType dtype, int64_t rows,
                                                             int64_t seq_len,
                                                             const EvalRank& rank) {
  std::unique_ptr<EvalModel> eval(new EvalModel());
  eval->rank_ = rank;
  eval->rows_ = rows;
  eval->seq_len_ = seq_len;
  NF_ASSIGN_OR_RETURN(eval->model_, CreateStageModel(config, dtype, rows, seq_len, rank));
  if (!eval->model_->placement().first()) {
    NF_ASSIGN_OR_RETURN(eval->received_,
                        ops::Zeros(dtype, {rows * seq_len, config.d_model()}, rank.device));
  }
  return eval;
}

absl::Status EvalModel::Load(const std::filesystem::path& dir,
                             const checkpoint::Manifest& manifest) {
  const parallel::Topology& topology = rank_.groups->topology;
  return checkpoint::LoadParameters(dir, manifest, model_->params(), topology.tp_rank(),
                                    topology.tp());
}

absl::Status EvalModel::CopyParameters(const EvalModel& from) {
  return ops::Copy(from.model_->params().params(), model_->params().params());
}

absl::Status EvalModel::Forward(const Tensor& inputs, const Tensor& targets) {
  const parallel::Topology& topology = rank_.groups->topology;
  const bool first = model_->placement().first(), last = model_->placement().last();
  if (!first) NF_RETURN_IF_ERROR(rank_.device_pp->Recv(received_, topology.pp_rank() - 1));
  NF_ASSIGN_OR_RETURN(const Tensor* output,
                      model_->ForwardStage(/*micro_batch=*/0, first ? &inputs : nullptr,
                                           first ? nullptr : &received_, targets,
                                           /*first_sample=*/0, /*train=*/false));
  if (!last) NF_RETURN_IF_ERROR(rank_.device_pp->Send(*output, topology.pp_rank() + 1));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<TokenScore>>> EvalModel::ScoreTokens(
    const std::vector<Span>& spans) {
  if (!last_stage()) return absl::InternalError("EvalModel::ScoreTokens on a stage without logits");
  const int64_t slice = model_->padded_vocab() / rank_.groups->topology.tp();
  const int64_t offset = model_->vocab_offset();
  // Columns of this slice that are real vocabulary entries: [0, valid).
  const int64_t valid =
      std::clamp<int64_t>(model_->config().vocab_size() - offset, int64_t{0}, slice);
  int64_t scored = 0;
  for (const Span& span : spans) scored += static_cast<int64_t>(span.targets.size());
  // Per scored token: this slice's maximum, then (sum of exponentials, target logit).
  NF_ASSIGN_OR_RETURN(const Tensor maxima, Tensor::HostZeros(DType::kF64, {scored}));
  NF_ASSIGN_OR_RETURN(const Tensor sums, Tensor::HostZeros(DType::kF64, {2 * scored}));
  std::vector<std::vector<float>> span_logits;  // per span: [tokens, slice] on the host
  int64_t k = 0;
  for (const Span& span : spans) {
    const int64_t n = static_cast<int64_t>(span.targets.size());
    NF_ASSIGN_OR_RETURN(const Tensor logits,
                        model_->logits().Slice(span.row * seq_len_ + span.position, n));
    NF_ASSIGN_OR_RETURN(const Tensor host, ops::OnHost(logits));
    NF_ASSIGN_OR_RETURN(std::vector<float> values, ToFloatVector(host));
    for (int64_t i = 0; i < n; ++i, ++k) {
      double best = -std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < valid; ++c) best = std::max<double>(best, values[i * slice + c]);
      maxima.data<double>()[k] = best;
    }
    span_logits.push_back(std::move(values));
  }
  NF_RETURN_IF_ERROR(rank_.groups->tp->AllReduce(maxima, parallel::ReduceOp::kMax));
  k = 0;
  for (size_t s = 0; s < spans.size(); ++s) {
    for (size_t i = 0; i < spans[s].targets.size(); ++i, ++k) {
      const float* row = span_logits[s].data() + i * slice;
      const double best = maxima.data<double>()[k];
      double sum = 0.0;
      for (int64_t c = 0; c < valid; ++c) sum += std::exp(static_cast<double>(row[c]) - best);
      sums.data<double>()[2 * k] = sum;
      const int64_t local = spans[s].targets[i] - offset;
      if (local >= 0 && local < valid) sums.data<double>()[2 * k + 1] = row[local];
    }
  }
  NF_RETURN_IF_ERROR(rank_.groups->tp->AllReduce(sums, parallel::ReduceOp::kSum));
  std::vector<std::vector<TokenScore>> scores;
  k = 0;
  for (const Span& span : spans) {
    std::vector<TokenScore>& out = scores.emplace_back();
    for (size_t i = 0; i < span.targets.size(); ++i, ++k) {
      const double best = maxima.data<double>()[k];
      const double target = sums.data<double>()[2 * k + 1];
      out.push_back({.logprob = target - best - std::log(sums.data<double>()[2 * k]),
                     .greedy = target >= best});
    }
  }
  return scores;
}

}  // namespace nf::eval
