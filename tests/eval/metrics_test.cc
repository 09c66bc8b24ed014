// eval/metrics: the three multiple-choice accuracies and LAMBADA's.
#include "eval/metrics.h"

#include <gtest/gtest.h>

#include <cmath>

namespace nf::eval {
namespace {

ChoiceScore Choice(double loglik, int64_t tokens, int64_t characters, bool greedy = false) {
  return {.loglik = loglik, .tokens = tokens, .characters = characters, .greedy = greedy};
}

TEST(MetricsTest, EachNormalisationPicksItsOwnChoice) {
  // Sums: -4 > -6 > -9. Per character: -6/20 = -0.3 is best. Per token: -9/10 = -0.9 is best.
  const std::vector<ChoiceScore> choices = {Choice(-4, 2, 4), Choice(-6, 4, 20),
                                            Choice(-9, 10, 10)};
  const Predictions p = Predict(choices);
  EXPECT_EQ(p.by_loglik, 0);
  EXPECT_EQ(p.by_characters, 1);
  EXPECT_EQ(p.by_tokens, 2);
  const MultipleChoiceAccuracy a =
      ScoreMultipleChoice({{.choices = choices, .label = 1}, {.choices = choices, .label = 0}});
  EXPECT_EQ(a.examples, 2);
  EXPECT_DOUBLE_EQ(a.acc, 0.5);
  EXPECT_DOUBLE_EQ(a.acc_norm, 0.5);
  EXPECT_DOUBLE_EQ(a.acc_token_norm, 0.0);
}

TEST(MetricsTest, TiesGoToTheFirstChoice) {
  const Predictions p = Predict({Choice(-1, 1, 1), Choice(-1, 1, 1)});
  EXPECT_EQ(p.by_loglik, 0);
  EXPECT_EQ(p.by_characters, 0);
  EXPECT_EQ(p.by_tokens, 0);
}

TEST(MetricsTest, LastWordAccuracyAndPerWordPerplexity) {
  const LastWordAccuracy a = ScoreLastWord({{.choices = {Choice(-1.0, 3, 5, true)}},
                                            {.choices = {Choice(-3.0, 1, 2, false)}},
                                            {.choices = {Choice(-2.0, 2, 4, true)}},
                                            {.choices = {Choice(-6.0, 2, 4, false)}}});
  EXPECT_EQ(a.examples, 4);
  EXPECT_DOUBLE_EQ(a.acc, 0.5);
  EXPECT_DOUBLE_EQ(a.ppl, std::exp(3.0));
}

TEST(MetricsTest, NoExamplesNoAccuracy) {
  EXPECT_EQ(ScoreMultipleChoice({}).examples, 0);
  EXPECT_EQ(ScoreLastWord({}).acc, 0.0);
}

}  // namespace
}  // namespace nf::eval
