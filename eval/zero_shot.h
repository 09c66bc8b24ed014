// Scoring token sequences (eval/sequences.h) on any evaluation layout: each micro-batch holds
// EvalModel::rows() sequences, one per row, padded after their end (a causal model's earlier
// positions never see the padding); data-parallel replica r takes micro-batches r, r + dp, ...;
// the last stage's tensor-parallel rank 0 of each replica writes the scores of its sequences, and
// one sum over the world gives every rank all of them.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "eval/eval_model.h"
#include "eval/sequences.h"

namespace nf::eval {

struct SequenceScore {
  double loglik = 0.0;  // the sum of the continuation tokens' log-probabilities
  bool greedy = false;  // every continuation token is its position's most likely token
};

// The scores of `sequences` (each at most model.seq_len() + 1 tokens), in order. Collective
// over the world.
absl::StatusOr<std::vector<SequenceScore>> ScoreSequences(
    EvalModel& model, const parallel::ProcessGroups& groups,
    const std::vector<ScoredSequence>& sequences);

}  // namespace nf::eval
