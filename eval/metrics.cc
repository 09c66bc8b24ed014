#include "eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace nf::eval {
namespace {

int ArgMax(const std::vector<ChoiceScore>& choices,
           const std::function<double(const ChoiceScore&)>& score) {
  int best = 0;
  for (int i = 1; i < static_cast<int>(choices.size()); ++i) {
    if (score(choices[i]) > score(choices[best])) best = i;
  }
  return best;
}

double PerLength(double loglik, int64_t length) {
  return loglik / static_cast<double>(std::max<int64_t>(length, 1));
}

}  // namespace

Predictions Predict(const std::vector<ChoiceScore>& choices) {
  return {.by_loglik = ArgMax(choices, [](const ChoiceScore& c) { return c.loglik; }),
          .by_characters = ArgMax(
              choices, [](const ChoiceScore& c) { return PerLength(c.loglik, c.characters); }),
          .by_tokens =
              ArgMax(choices, [](const ChoiceScore& c) { return PerLength(c.loglik, c.tokens); })};
}

MultipleChoiceAccuracy ScoreMultipleChoice(const std::vector<ScoredExample>& examples) {
  MultipleChoiceAccuracy result{.examples = static_cast<int64_t>(examples.size())};
  if (examples.empty()) return result;
  for (const ScoredExample& example : examples) {
    const Predictions p = Predict(example.choices);
    result.acc += p.by_loglik == example.label;
    result.acc_norm += p.by_characters == example.label;
    result.acc_token_norm += p.by_tokens == example.label;
  }
  const double n = static_cast<double>(examples.size());
  result.acc /= n;
  result.acc_norm /= n;
  result.acc_token_norm /= n;
  return result;
}

LastWordAccuracy ScoreLastWord(const std::vector<ScoredExample>& examples) {
  LastWordAccuracy result{.examples = static_cast<int64_t>(examples.size())};
  if (examples.empty()) return result;
  double loglik = 0.0;
  for (const ScoredExample& example : examples) {
    const ChoiceScore& word = example.choices.front();
    result.acc += word.greedy;
    loglik += word.loglik;
  }
  const double n = static_cast<double>(examples.size());
  result.acc /= n;
  result.ppl = std::exp(-loglik / n);
  return result;
}

}  // namespace nf::eval
