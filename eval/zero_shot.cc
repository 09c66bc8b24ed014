#include "eval/zero_shot.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace nf::eval {

absl::StatusOr<std::vector<SequenceScore>> ScoreSequences(
    EvalModel& model, const parallel::ProcessGroups& groups,
    const std::vector<ScoredSequence>& sequences) {
  const parallel::Topology& topology = groups.topology;
  const int64_t rows = model.rows(), seq_len = model.seq_len();
  const int64_t count = static_cast<int64_t>(sequences.size());
  for (int64_t i = 0; i < count; ++i) {
    if (static_cast<int64_t>(sequences[i].tokens.size()) > seq_len + 1) {
      return absl::InternalError(absl::StrCat("sequence ", i, " does not fit the window"));
    }
  }
  // [count, 2]: the log-likelihood and the greedy flag (0 or 1) of every sequence.
  NF_ASSIGN_OR_RETURN(const Tensor results, Tensor::HostZeros(DType::kF64, {2 * count}));
  NF_ASSIGN_OR_RETURN(const Tensor inputs, Tensor::HostZeros(DType::kI32, {rows, seq_len}));
  NF_ASSIGN_OR_RETURN(const Tensor no_targets, Tensor::HostZeros(DType::kI32, {rows, seq_len}));
  std::fill_n(no_targets.data<int32_t>(), rows * seq_len, -1);
  const bool writes = model.last_stage() && topology.tp_rank() == 0;
  const int64_t batches = (count + rows - 1) / rows;
  for (int64_t batch = topology.dp_rank(); batch < batches; batch += topology.dp()) {
    const int64_t first = batch * rows, used = std::min(rows, count - first);
    std::fill_n(inputs.data<int32_t>(), rows * seq_len, 0);
    std::vector<EvalModel::Span> spans;
    for (int64_t r = 0; r < used; ++r) {
      const ScoredSequence& sequence = sequences[first + r];
      // The inputs are every token but the last; position p predicts token p + 1.
      std::copy(sequence.tokens.begin(), sequence.tokens.end() - 1,
                inputs.data<int32_t>() + r * seq_len);
      spans.push_back({.row = r,
                       .position = sequence.scored_from - 1,
                       .targets = std::vector<int32_t>(
                           sequence.tokens.begin() + sequence.scored_from, sequence.tokens.end())});
    }
    NF_RETURN_IF_ERROR(model.Forward(inputs, no_targets));
    if (!model.last_stage()) continue;
    NF_ASSIGN_OR_RETURN(const auto scores, model.ScoreTokens(spans));
    if (!writes) continue;
    for (int64_t r = 0; r < used; ++r) {
      double loglik = 0.0;
      bool greedy = true;
      for (const TokenScore& token : scores[r]) {
        loglik += token.logprob;
        greedy = greedy && token.greedy;
      }
      results.data<double>()[2 * (first + r)] = loglik;
      results.data<double>()[2 * (first + r) + 1] = greedy ? 1.0 : 0.0;
    }
  }
  NF_RETURN_IF_ERROR(groups.world->AllReduce(results, parallel::ReduceOp::kSum));
  std::vector<SequenceScore> out(count);
  for (int64_t i = 0; i < count; ++i) {
    out[i] = {.loglik = results.data<double>()[2 * i],
              .greedy = results.data<double>()[2 * i + 1] > 0.5};
  }
  return out;
}

}  // namespace nf::eval
