// The sampler on known logits: each truncation's kept set and probabilities computed by hand,
// and the draws' reproducibility and frequencies.
#include "generate/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace nf::generate {
namespace {

// logits ln(4), ln(3), ln(2), ln(1), ln(0.5) (in scrambled order): softmax 4/10.5, 3/10.5, ...
const std::vector<float> kLogits = {std::log(2.0f), std::log(0.5f), std::log(4.0f), std::log(1.0f),
                                    std::log(3.0f)};
constexpr double kTotal = 10.5;

std::vector<int32_t> Ids(const std::vector<Candidate>& candidates) {
  std::vector<int32_t> ids;
  for (const Candidate& c : candidates) ids.push_back(c.id);
  return ids;
}

TEST(SamplerTest, GreedyIsTheArgmaxAndTheLowestIdAmongTies) {
  const SamplingOptions greedy{.temperature = 0.0};
  EXPECT_EQ(SampleToken(kLogits, greedy, 0, 0), 2);
  const std::vector<float> tied = {1.0f, 5.0f, 5.0f, -2.0f};
  EXPECT_EQ(SampleToken(tied, greedy, 0, 0), 1);
  for (uint64_t step = 0; step < 50; ++step) EXPECT_EQ(SampleToken(tied, greedy, 7, step), 1);
}

TEST(SamplerTest, TemperatureOneIsTheSoftmaxMostLikelyFirst) {
  const std::vector<Candidate> d = SamplingDistribution(kLogits, {});
  EXPECT_EQ(Ids(d), (std::vector<int32_t>{2, 4, 0, 3, 1}));
  const double expected[] = {4 / kTotal, 3 / kTotal, 2 / kTotal, 1 / kTotal, 0.5 / kTotal};
  for (size_t i = 0; i < d.size(); ++i) EXPECT_NEAR(d[i].probability, expected[i], 1e-7);
}

TEST(SamplerTest, TemperatureSharpensAndFlattens) {
  // T = 0.5 squares the odds: 16, 9, 4, 1, 0.25.
  const std::vector<Candidate> sharp = SamplingDistribution(kLogits, {.temperature = 0.5});
  EXPECT_NEAR(sharp[0].probability, 16 / 30.25, 1e-6);
  EXPECT_NEAR(sharp[4].probability, 0.25 / 30.25, 1e-6);
  // T = 2 takes square roots: 2, sqrt 3, sqrt 2, 1, sqrt 0.5.
  const std::vector<Candidate> flat = SamplingDistribution(kLogits, {.temperature = 2.0});
  const double total = 2 + std::sqrt(3.0) + std::sqrt(2.0) + 1 + std::sqrt(0.5);
  EXPECT_NEAR(flat[0].probability, 2 / total, 1e-6);
  EXPECT_NEAR(flat[1].probability, std::sqrt(3.0) / total, 1e-6);
}

TEST(SamplerTest, TopKKeepsTheKMostLikelyRenormalised) {
  const std::vector<Candidate> d = SamplingDistribution(kLogits, {.top_k = 2});
  EXPECT_EQ(Ids(d), (std::vector<int32_t>{2, 4}));
  EXPECT_NEAR(d[0].probability, 4 / 7.0, 1e-7);
  EXPECT_NEAR(d[1].probability, 3 / 7.0, 1e-7);
  EXPECT_EQ(SamplingDistribution(kLogits, {.top_k = 99}).size(), 5u);
}

TEST(SamplerTest, TopPKeepsTheFewestTokensWhoseMassReachesP) {
  // Cumulative mass: 0.381, 0.667, 0.857, 0.952, 1.
  EXPECT_EQ(Ids(SamplingDistribution(kLogits, {.top_p = 0.3})), (std::vector<int32_t>{2}));
  EXPECT_EQ(Ids(SamplingDistribution(kLogits, {.top_p = 0.6})), (std::vector<int32_t>{2, 4}));
  const std::vector<Candidate> d = SamplingDistribution(kLogits, {.top_p = 0.8});
  EXPECT_EQ(Ids(d), (std::vector<int32_t>{2, 4, 0}));
  EXPECT_NEAR(d[2].probability, 2 / 9.0, 1e-7);
  // Exactly reaching p stops there: 7 / 10.5 = 2/3.
  EXPECT_EQ(SamplingDistribution(kLogits, {.top_p = 7 / 10.5}).size(), 2u);
  // Top-k first, then top-p of what it kept: of {4, 3, 2} / 9, 0.5 needs 4/9 + 3/9.
  EXPECT_EQ(Ids(SamplingDistribution(kLogits, {.top_k = 3, .top_p = 0.5})),
            (std::vector<int32_t>{2, 4}));
}

TEST(SamplerTest, DrawsAreAPureFunctionOfSeedSequenceAndStep) {
  for (uint64_t step = 0; step < 20; ++step) {
    EXPECT_EQ(UniformDraw(5, 3, step), UniformDraw(5, 3, step));
    EXPECT_EQ(SampleToken(kLogits, {.seed = 5}, 3, step),
              SampleToken(kLogits, {.seed = 5}, 3, step));
  }
  EXPECT_NE(UniformDraw(5, 3, 0), UniformDraw(6, 3, 0));
  EXPECT_NE(UniformDraw(5, 3, 0), UniformDraw(5, 4, 0));
  EXPECT_NE(UniformDraw(5, 3, 0), UniformDraw(5, 3, 1));
}

TEST(SamplerTest, DrawFrequenciesFollowTheDistribution) {
  constexpr int kDraws = 20000;
  std::vector<int> counts(5);
  for (int step = 0; step < kDraws; ++step) ++counts[SampleToken(kLogits, {.seed = 9}, 0, step)];
  const double expected[] = {2 / kTotal, 0.5 / kTotal, 4 / kTotal, 1 / kTotal, 3 / kTotal};
  for (int id = 0; id < 5; ++id) {
    // 4 standard deviations of a binomial frequency.
    const double sd = std::sqrt(expected[id] * (1 - expected[id]) / kDraws);
    EXPECT_NEAR(counts[id] / static_cast<double>(kDraws), expected[id], 4 * sd) << "id " << id;
  }
  for (int step = 0; step < 1000; ++step) {
    const int32_t id = SampleToken(kLogits, {.top_k = 2, .seed = 9}, 1, step);
    EXPECT_TRUE(id == 2 || id == 4);
  }
}

TEST(SamplerTest, RefusesOptionsOutOfRange) {
  EXPECT_FALSE(CheckSamplingOptions({.temperature = -1}).ok());
  EXPECT_FALSE(CheckSamplingOptions({.top_k = -1}).ok());
  EXPECT_FALSE(CheckSamplingOptions({.top_p = 0}).ok());
  EXPECT_FALSE(CheckSamplingOptions({.top_p = 1.5}).ok());
  EXPECT_TRUE(CheckSamplingOptions({.temperature = 0, .top_k = 3, .top_p = 0.9}).ok());
}

}  // namespace
}  // namespace nf::generate
