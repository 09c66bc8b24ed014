#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace nf::eval {

absl::StatusOr<DocumentTokens> DocumentTokens::Open(const std::string& prefix,
                                                    data::DocumentRange range) {
  NF_ASSIGN_OR_RETURN(std::unique_ptr<data::IndexedDataset> dataset,
                      data::IndexedDataset::Open(prefix));
  if (range.begin < 0 || range.end < range.begin || range.end > dataset->num_documents()) {
    return absl::InvalidArgumentError(absl::StrCat("documents [", range.begin, ", ", range.end,
                                                   ") are not within the ",
                                                   dataset->num_documents(), " of ", prefix));
  }
  DocumentTokens tokens;
  tokens.starts_.push_back(0);
  const std::vector<int64_t>& index = dataset->document_index();
  for (int64_t s = index[range.begin]; s < index[range.end]; ++s) {
    tokens.sequences_.push_back(s);
    tokens.starts_.push_back(tokens.starts_.back() + dataset->sequence_length(s));
  }
  tokens.dataset_ = std::move(dataset);
  return tokens;
}

void DocumentTokens::Read(int64_t offset, int64_t count, int32_t* out) const {
  // The sequence holding `offset`: the last start at or before it.
  size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) -
                                 starts_.begin() - 1);
  while (count > 0) {
    const int64_t within = offset - starts_[s];
    const int64_t n = std::min(count, starts_[s + 1] - offset);
    dataset_->ReadTokens(sequences_[s], within, n, out);
    out += n;
    offset += n;
    count -= n;
    ++s;
  }
}

namespace {

// The loss the last stage's forwards accumulated, summed over the world into the result of
// `windows` windows. Only the last stage accumulated losses, and only its tp rank 0 reports
// them.
absl::StatusOr<PerplexityResult> GatherLoss(EvalModel& model, const parallel::ProcessGroups& groups,
                                            int64_t windows) {
  NF_ASSIGN_OR_RETURN(const model::NormFormerModel::LossSum local, model.TakeLossSum());
  NF_ASSIGN_OR_RETURN(const Tensor total, Tensor::HostZeros(DType::kF64, {2}));
  if (model.last_stage() && groups.topology.tp_rank() == 0) {
    total.data<double>()[0] = local.sum;
    total.data<double>()[1] = static_cast<double>(local.tokens);
  }
  NF_RETURN_IF_ERROR(groups.world->AllReduce(total, parallel::ReduceOp::kSum));
  PerplexityResult result;
  result.windows = windows;
  result.tokens = static_cast<int64_t>(total.data<double>()[1]);
  result.loss = total.data<double>()[0] / static_cast<double>(result.tokens);
  result.ppl = std::exp(result.loss);
  return result;
}

}  // namespace

absl::StatusOr<PerplexityResult> EvaluatePerplexity(EvalModel& model,
                                                    const parallel::ProcessGroups& groups,
                                                    const DocumentTokens& tokens,
                                                    int64_t max_windows) {
  const parallel::Topology& topology = groups.topology;
  const int64_t rows = model.rows(), seq_len = model.seq_len();
  const int64_t predicted = tokens.size() - 1;
  if (predicted < 1) {
    return absl::InvalidArgumentError(
        "the documents hold fewer than two tokens: nothing to predict");
  }
  int64_t windows = (predicted + seq_len - 1) / seq_len;
  if (max_windows > 0) windows = std::min(windows, max_windows);
  NF_ASSIGN_OR_RETURN(const Tensor inputs, Tensor::HostZeros(DType::kI32, {rows, seq_len}));
  NF_ASSIGN_OR_RETURN(const Tensor targets, Tensor::HostZeros(DType::kI32, {rows, seq_len}));
  std::vector<int32_t> window(seq_len + 1);
  const int64_t batches = (windows + rows - 1) / rows;
  for (int64_t batch = topology.dp_rank(); batch < batches; batch += topology.dp()) {
    std::fill_n(inputs.data<int32_t>(), rows * seq_len, 0);
    std::fill_n(targets.data<int32_t>(), rows * seq_len, -1);
    for (int64_t r = 0; r < rows && batch * rows + r < windows; ++r) {
      const int64_t start = (batch * rows + r) * seq_len;
      const int64_t length = std::min(seq_len + 1, tokens.size() - start);
      tokens.Read(start, length, window.data());
      std::copy_n(window.begin(), length - 1, inputs.data<int32_t>() + r * seq_len);
      std::copy_n(window.begin() + 1, length - 1, targets.data<int32_t>() + r * seq_len);
    }
    NF_RETURN_IF_ERROR(model.Forward(inputs, targets));
  }
  return GatherLoss(model, groups, windows);
}

absl::StatusOr<PerplexityResult> EvaluateMaskedPerplexity(EvalModel& model,
                                                          const parallel::ProcessGroups& groups,
                                                          const DocumentTokens& tokens,
                                                          const data::MaskedLmSpec& spec,
                                                          int64_t max_windows) {
  const parallel::Topology& topology = groups.topology;
  const int64_t rows = model.rows(), seq_len = model.seq_len();
  int64_t windows = tokens.size() / seq_len;
  if (windows == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the documents hold ", tokens.size(),
                                                   " tokens, fewer than one window of ", seq_len,
                                                   " (--seq-len)"));
  }
  if (max_windows > 0) windows = std::min(windows, max_windows);
  NF_ASSIGN_OR_RETURN(const Tensor inputs, Tensor::HostZeros(DType::kI32, {rows, seq_len}));
  NF_ASSIGN_OR_RETURN(const Tensor targets, Tensor::HostZeros(DType::kI32, {rows, seq_len}));
  std::vector<int32_t> window(seq_len);
  const auto length = static_cast<size_t>(seq_len);
  const int64_t batches = (windows + rows - 1) / rows;
  for (int64_t batch = topology.dp_rank(); batch < batches; batch += topology.dp()) {
    // The last batch's rows past the windows stay padding: targets -1, so no loss.
    std::fill_n(inputs.data<int32_t>(), rows * seq_len, 0);
    std::fill_n(targets.data<int32_t>(), rows * seq_len, -1);
    for (int64_t r = 0; r < rows && batch * rows + r < windows; ++r) {
      const int64_t k = batch * rows + r;
      tokens.Read(k * seq_len, seq_len, window.data());
      data::MaskSample(spec, static_cast<uint64_t>(k), window,
                       {inputs.data<int32_t>() + r * seq_len, length},
                       {targets.data<int32_t>() + r * seq_len, length});
    }
    NF_RETURN_IF_ERROR(model.Forward(inputs, targets));
  }
  NF_ASSIGN_OR_RETURN(PerplexityResult result, GatherLoss(model, groups, windows));
  // Every rank sums the same total, so all refuse alike; only a tiny mask_prob x seq_len leaves
  // every window without a chosen token.
  if (result.tokens == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no token of the ", windows, " windows of ", seq_len,
        " was masked (data.masked_lm.mask_prob ", spec.mask_prob, "): nothing to predict"));
  }
  result.mask_seed = spec.seed;
  return result;
}

}  // namespace nf::eval
