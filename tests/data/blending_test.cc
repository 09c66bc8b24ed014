// Tests of data/blending.h: at every prefix of the blended stream each dataset's realised count
// is within one sample of its target share, each dataset's samples are taken in order, counts
// bound what each dataset must offer, the result is deterministic, and bad weights are refused.
#include "data/blending.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace nf::data {
namespace {

using ::nf::testing::ExpectInvalidArgument;

Blending MustBlend(const std::vector<double>& weights, int64_t size) {
  absl::StatusOr<Blending> blending = Blending::Build(weights, size);
  NF_EXPECT_OK(blending);
  if (!blending.ok()) std::abort();
  return *std::move(blending);
}

// Checks |c_k(n) - w_k n| < 1 for every prefix n and dataset k, that dataset k's samples come
// in order 0, 1, 2, ..., and that counts() are the totals; returns the largest deviation.
double CheckBlend(const Blending& blending, const std::string& what) {
  const int num_datasets = blending.num_datasets();
  std::vector<int64_t> counts(num_datasets, 0);
  double worst = 0.0;
  for (int64_t i = 0; i < blending.size(); ++i) {
    const int k = blending.dataset(i);
    EXPECT_TRUE(k >= 0 && k < num_datasets) << what;
    EXPECT_EQ(blending.sample(i), counts[k]) << what << ", sample " << i;
    ++counts[k];
    for (int j = 0; j < num_datasets; ++j) {
      const double deviation =
          static_cast<double>(counts[j]) - blending.weights()[j] * static_cast<double>(i + 1);
      worst = std::max(worst, std::abs(deviation));
      if (std::abs(deviation) >= 1.0 + 1e-9) {
        ADD_FAILURE() << what << ": dataset " << j << " has " << counts[j] << " of " << i + 1
                      << " samples, target " << blending.weights()[j] * (i + 1);
        return worst;
      }
    }
  }
  for (int k = 0; k < num_datasets; ++k) {
    EXPECT_EQ(blending.counts()[k], counts[k]) << what;
    EXPECT_LE(counts[k],
              static_cast<int64_t>(std::ceil(blending.weights()[k] * blending.size() - 1e-9)))
        << what;
  }
  return worst;
}

TEST(BlendingTest, RealisedCountsStayWithinOneSampleOfTheTargets) {
  CheckBlend(MustBlend({0.7, 0.3}, 1000), "0.7, 0.3");
  CheckBlend(MustBlend({1, 1, 1}, 999), "thirds");
  CheckBlend(MustBlend({0.5, 0.25, 0.125, 0.125}, 1024), "powers of two");
  CheckBlend(MustBlend({1e-3, 1, 1e-4, 0.5, 3e-2}, 20000), "skewed");
  // Random weights of 2 to 12 datasets, many very unequal (cubes of uniforms): the weights
  // under which the plain largest-lag greedy falls more than a sample behind.
  std::mt19937 rng(1234);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  double worst = 0.0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<double> weights(2 + rng() % 11);
    for (double& w : weights) w = std::pow(uniform(rng), 3.0) + 1e-6;
    worst = std::max(worst, CheckBlend(MustBlend(weights, 1500), "trial " + std::to_string(trial)));
  }
  EXPECT_GT(worst, 0.9) << "the trials should come close to the bound";
}

TEST(BlendingTest, InterleavesRatherThanRunningDatasetsInBlocks) {
  const Blending blending = MustBlend({3, 1}, 8);
  std::vector<int> order;
  for (int64_t i = 0; i < blending.size(); ++i) order.push_back(blending.dataset(i));
  EXPECT_EQ(order, (std::vector<int>{0, 0, 0, 1, 0, 0, 0, 1}));
}

TEST(BlendingTest, WeightsAreNormalisedAndTheBlendDeterministic) {
  const Blending a = MustBlend({3, 1}, 500);
  const Blending b = MustBlend({0.75, 0.25}, 500);
  const Blending c = MustBlend({3, 1}, 500);
  EXPECT_EQ(a.weights()[0], 0.75);
  EXPECT_EQ(a.weights()[1], 0.25);
  for (int64_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a.dataset(i), b.dataset(i));
    EXPECT_EQ(a.dataset(i), c.dataset(i));
    EXPECT_EQ(a.sample(i), c.sample(i));
  }
  EXPECT_EQ(a.counts()[0], 375);
  EXPECT_EQ(a.counts()[1], 125);
  // A longer blend starts with the shorter one: growing the run keeps the blended prefix.
  const Blending longer = MustBlend({3, 1}, 800);
  for (int64_t i = 0; i < a.size(); ++i) EXPECT_EQ(longer.dataset(i), a.dataset(i));
}

TEST(BlendingTest, ZeroWeightDatasetsAreNeverUsedAndOneDatasetIsTheIdentity) {
  const Blending zero = MustBlend({0, 1, 0}, 100);
  EXPECT_EQ(zero.counts()[0], 0);
  EXPECT_EQ(zero.counts()[1], 100);
  EXPECT_EQ(zero.counts()[2], 0);
  const Blending one = MustBlend({2.5}, 50);
  for (int64_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(one.dataset(i), 0);
    EXPECT_EQ(one.sample(i), i);
  }
  EXPECT_EQ(MustBlend({1, 1}, 0).size(), 0);
}

TEST(BlendingTest, RejectsBadWeights) {
  ExpectInvalidArgument(Blending::Build({}, 10).status(), "data: blend: 0 datasets");
  ExpectInvalidArgument(Blending::Build(std::vector<double>{1, -0.5}, 10).status(),
                        "weight 2 (-0.5) must be a finite number >= 0");
  ExpectInvalidArgument(Blending::Build(std::vector<double>{NAN, 1}, 10).status(), "weight 1");
  ExpectInvalidArgument(Blending::Build(std::vector<double>{INFINITY}, 10).status(), "weight 1");
  ExpectInvalidArgument(Blending::Build(std::vector<double>{0, 0}, 10).status(), "positive sum");
  ExpectInvalidArgument(Blending::Build(std::vector<double>{1}, -1).status(), "size -1");
}

}  // namespace
}  // namespace nf::data
