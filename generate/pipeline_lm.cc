#include "generate/pipeline_lm.h"

#include "absl/strings/str_cat.h"
#include "checkpoint/load_parameters.h"
#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::generate {

absl::StatusOr<std::unique_ptr<PipelineLm>> PipelineLm::Create(const model::ModelConfig& config,
                                                               DType dtype, int64_t seq_len,
                                                               const eval::EvalRank& rank) {
  std::unique_ptr<PipelineLm> lm(new PipelineLm());
  lm->rank_ = rank;
  lm->seq_len_ = seq_len;
  NF_ASSIGN_OR_RETURN(lm->model_, eval::CreateStageModel(config, dtype, /*rows=*/1, seq_len, rank));
  if (!lm->model_->placement().first()) {
    NF_ASSIGN_OR_RETURN(lm->received_, ops::Zeros(dtype, {seq_len, config.d_model()}, rank.device));
  }
  return lm;
}

absl::Status PipelineLm::Load(const std::filesystem::path& dir,
                              const checkpoint::Manifest& manifest) {
  const parallel::Topology& topology = rank_.groups->topology;
  return checkpoint::LoadParameters(dir, manifest, model_->params(), topology.tp_rank(),
                                    topology.tp());
}

absl::Status PipelineLm::CopyParameters(const PipelineLm& from) {
  return ops::Copy(from.model_->params().params(), model_->params().params());
}

absl::Status PipelineLm::CopyParameters(const model::ParamTable& from) {
  for (const model::ParamTable::Entry& entry : model_->params().entries()) {
    if (!from.Contains(entry.spec.name)) {
      return absl::InternalError(
          absl::StrCat("PipelineLm: the model to copy lacks ", entry.spec.name));
    }
    NF_RETURN_IF_ERROR(ops::Copy(from.Get(entry.spec.name).value, entry.value));
  }
  return absl::OkStatus();
}

absl::Status PipelineLm::StartSequence(int64_t capacity) { return model_->StartKvCache(capacity); }

absl::StatusOr<std::vector<float>> PipelineLm::Cached(std::span<const int32_t> ids) {
  return Run(ids, /*cached=*/true);
}

absl::StatusOr<std::vector<float>> PipelineLm::Full(std::span<const int32_t> ids) {
  return Run(ids, /*cached=*/false);
}

absl::StatusOr<std::vector<float>> PipelineLm::Run(std::span<const int32_t> ids, bool cached) {
  if (static_cast<int64_t>(ids.size()) != seq_len_) {
    return absl::InternalError(
        absl::StrCat("PipelineLm: ", ids.size(), " ids for a model of seq_len ", seq_len_));
  }
  const parallel::Topology& topology = rank_.groups->topology;
  const bool first = model_->placement().first(), last = model_->placement().last();
  NF_ASSIGN_OR_RETURN(const Tensor inputs, Tensor::HostEmpty(DType::kI32, {1, seq_len_}));
  std::copy(ids.begin(), ids.end(), inputs.data<int32_t>());
  if (!first) NF_RETURN_IF_ERROR(rank_.device_pp->Recv(received_, topology.pp_rank() - 1));
  const Tensor* input_ids = first ? &inputs : nullptr;
  const Tensor* input_hidden = first ? nullptr : &received_;
  const Tensor* output = nullptr;
  if (cached) {
    NF_ASSIGN_OR_RETURN(output, model_->ForwardCached(input_ids, input_hidden));
  } else {
    NF_ASSIGN_OR_RETURN(const Tensor no_targets, Tensor::HostEmpty(DType::kI32, {1, seq_len_}));
    std::fill_n(no_targets.data<int32_t>(), seq_len_, -1);
    NF_ASSIGN_OR_RETURN(output, model_->ForwardStage(0, input_ids, input_hidden, no_targets,
                                                     /*first_sample=*/0, /*train=*/false));
  }
  if (!last) NF_RETURN_IF_ERROR(rank_.device_pp->Send(*output, topology.pp_rank() + 1));
  return GatherLogits();
}

// The last stage's slices, gathered over tp to [seq_len, V_pad] and cut to the real vocabulary,
// then broadcast from the last stage over pp (host tensors over the host groups).
absl::StatusOr<std::vector<float>> PipelineLm::GatherLogits() {
  const parallel::Topology& topology = rank_.groups->topology;
  const int64_t vocab = vocab_size();
  NF_ASSIGN_OR_RETURN(const Tensor rows, Tensor::HostZeros(DType::kF32, {seq_len_, vocab}));
  if (model_->placement().last()) {
    const int tp = topology.tp();
    const int64_t slice = model_->padded_vocab() / tp;
    NF_ASSIGN_OR_RETURN(const Tensor local, ops::OnHost(model_->logits()));
    NF_ASSIGN_OR_RETURN(const std::vector<float> values, ToFloatVector(local));
    NF_ASSIGN_OR_RETURN(const Tensor mine, Tensor::HostEmpty(DType::kF32, {seq_len_ * slice}));
    std::copy(values.begin(), values.end(), mine.data<float>());
    // [tp, seq_len, slice]: rank r's slice holds vocabulary ids [r * slice, (r + 1) * slice).
    NF_ASSIGN_OR_RETURN(const Tensor all, Tensor::HostEmpty(DType::kF32, {tp * seq_len_ * slice}));
    NF_RETURN_IF_ERROR(rank_.groups->tp->AllGather(mine, all));
    for (int r = 0; r < tp; ++r) {
      for (int64_t t = 0; t < seq_len_; ++t) {
        for (int64_t c = 0; c < slice && r * slice + c < vocab; ++c) {
          rows.data<float>()[t * vocab + r * slice + c] =
              all.data<float>()[(r * seq_len_ + t) * slice + c];
        }
      }
    }
  }
  NF_RETURN_IF_ERROR(rank_.groups->pp->Broadcast(rows, topology.pp() - 1));
  return std::vector<float>(rows.data<float>(), rows.data<float>() + seq_len_ * vocab);
}

}  // namespace nf::generate
