// Accuracy and perplexity from the scores of a task's choices. A multiple-choice example
// predicts the choice with the highest score (the first of equal ones, as numpy's argmax), under
// three scores:
//   acc             the continuation's log-likelihood: the sum of its tokens' log-probabilities
//   acc_norm        that divided by the choice's length in characters (lm-evaluation-harness's
//                   acc_norm; its authors' blog calls it byte-length normalisation, its code
//                   counts characters, as this does)
//   acc_token_norm  that divided by the continuation's token count: the per-token likelihood
//                   GPT-3 (Brown et al. 2020, section 2.4) compares on most tasks, the setup the
//                   NormFormer paper's zero-shot numbers follow
// For WinoGrande every choice scores the same continuation, so the three agree. LAMBADA's
// accuracy counts examples whose last word's tokens are all the model's greedy predictions, and
// its perplexity is exp(-mean over examples of the last word's log-likelihood), per word as
// lm-evaluation-harness reports it.
#pragma once

#include <cstdint>
#include <vector>

namespace nf::eval {

struct ChoiceScore {
  double loglik = 0.0;
  int64_t tokens = 0;      // scored continuation tokens
  int64_t characters = 0;  // of the choice (eval/sequences.h ChoiceCharacters)
  bool greedy = false;
};

struct ScoredExample {
  std::vector<ChoiceScore> choices;
  int label = 0;
};

struct MultipleChoiceAccuracy {
  int64_t examples = 0;
  double acc = 0.0, acc_norm = 0.0, acc_token_norm = 0.0;
};
MultipleChoiceAccuracy ScoreMultipleChoice(const std::vector<ScoredExample>& examples);

// The choice each score picks for one example.
struct Predictions {
  int by_loglik = 0, by_characters = 0, by_tokens = 0;
};
Predictions Predict(const std::vector<ChoiceScore>& choices);

struct LastWordAccuracy {
  int64_t examples = 0;
  double acc = 0.0;
  double ppl = 0.0;
};
// One choice per example.
LastWordAccuracy ScoreLastWord(const std::vector<ScoredExample>& examples);

}  // namespace nf::eval
