// Tests of data/masked_lm.h: the exact number of chosen positions, targets -1 exactly off them
// and the original on them, RoBERTa's 80/10/10 outcomes and uniform positions within binomial
// tolerances, random replacements uniform and never <mask>, and masks that are a pure function
// of (seed, sample): repeatable, independent of the order samples are masked in, and different
// for another sample or seed.
#include "data/masked_lm.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/philox.h"
#include "gtest/gtest.h"

namespace nf::data {
namespace {

constexpr uint32_t kSeed = 1234;

struct Masked {
  std::vector<int32_t> inputs, targets;
  bool operator==(const Masked&) const = default;
};

Masked Mask(const MaskedLmSpec& spec, uint64_t sample, const std::vector<int32_t>& tokens) {
  Masked out{std::vector<int32_t>(tokens.size(), -7), std::vector<int32_t>(tokens.size(), -7)};
  MaskSample(spec, sample, tokens, out.inputs, out.targets);
  return out;
}

// tokens[p] = p mod (vocab_size - 1): every id but the last, vocab_size - 1, which the tests
// make <mask>, so an input equal to <mask> can only have been masked.
std::vector<int32_t> Tokens(int64_t length, int64_t vocab_size) {
  std::vector<int32_t> tokens(length);
  for (int64_t p = 0; p < length; ++p) tokens[p] = static_cast<int32_t>(p % (vocab_size - 1));
  return tokens;
}

MaskedLmSpec Spec(int64_t vocab_size) {
  return {
      .mask_token = static_cast<int32_t>(vocab_size - 1), .vocab_size = vocab_size, .seed = kSeed};
}

int64_t Chosen(const Masked& masked) {
  int64_t n = 0;
  for (const int32_t target : masked.targets) n += target != -1;
  return n;
}

TEST(MaskedCountTest, IsTheFloorOfTheExpectedCountPlusU) {
  struct Case {
    double mask_prob;
    int64_t seq_len;
    double u;
    int64_t n;
  };
  for (const Case& c : std::vector<Case>{{0.15, 10, 0.0, 1},
                                         {0.15, 10, 0.49, 1},
                                         {0.15, 10, 0.5, 2},
                                         {0.15, 10, 0.99, 2},
                                         {0.15, 1, 0.0, 0},
                                         {0.15, 1, 0.8, 0},
                                         {0.15, 1, 0.9, 1},
                                         {0.15, 512, 0.1, 76},
                                         {0.15, 512, 0.3, 77},
                                         {0.25, 8, 0.0, 2},
                                         {0.25, 8, 0.999, 2},
                                         {0.5, 2048, 0.0, 1024},
                                         {1.0, 7, 0.0, 7},
                                         {1.0, 7, 0.999, 7},
                                         {0.15, 0, 0.999, 0}}) {
    EXPECT_EQ(MaskedCount(c.mask_prob, c.seq_len, c.u), c.n)
        << c.mask_prob << " x " << c.seq_len << " + " << c.u;
  }
}

// The u of a sample is Philox's first two words at counter {0, sample low, sample high, 0}
// under key {seed, kMaskedLmStream}, as the header documents; it pins the stream, so that
// masks of a run stay those of its checkpoints.
TEST(MaskedCountTest, UniformFollowsTheDocumentedPhiloxCoordinates) {
  const uint64_t sample = (uint64_t{5} << 32) | 17;
  const PhiloxCounter words = Philox4x32_10({0, 17, 5, 0}, {kSeed, kMaskedLmStream});
  const uint64_t draw = static_cast<uint64_t>(words[1]) << 32 | words[0];
  EXPECT_EQ(MaskedCountUniform(kSeed, sample), static_cast<double>(draw >> 11) * 0x1p-53);
}

// Each sample chooses exactly MaskedCount(mask_prob, L, its u) positions, for lengths from one
// token to 512 and rates from 1% to all.
TEST(MaskSampleTest, ChoosesExactlyTheCountOfItsU) {
  for (const double mask_prob : {0.01, 0.15, 0.5, 1.0}) {
    for (const int64_t length : {1, 2, 7, 100, 512}) {
      MaskedLmSpec spec = Spec(50);
      spec.mask_prob = mask_prob;
      const std::vector<int32_t> tokens = Tokens(length, 50);
      for (uint64_t sample = 0; sample < 50; ++sample) {
        const int64_t n = MaskedCount(mask_prob, length, MaskedCountUniform(kSeed, sample));
        ASSERT_EQ(Chosen(Mask(spec, sample, tokens)), n)
            << "mask_prob " << mask_prob << ", L " << length << ", sample " << sample;
      }
    }
  }
}

// E[floor(p L + u)] = p L exactly for u uniform, so the mean count over S samples is p L up to
// the sampling noise: n takes floor(p L) or that + 1, a Bernoulli(frac(p L)) spread with
// sd <= 0.5, so the mean's sd is <= 0.5 / sqrt(S) (0.0112 for S = 2000): 6 of them is 0.067.
TEST(MaskSampleTest, MeanCountIsMaskProbTimesLength) {
  constexpr int kSamples = 2000;
  const MaskedLmSpec spec = Spec(50);
  for (const int64_t length : {10, 33}) {  // p L = 1.5, 4.95
    double total = 0;
    for (uint64_t sample = 0; sample < kSamples; ++sample) {
      total += static_cast<double>(
          MaskedCount(spec.mask_prob, length, MaskedCountUniform(kSeed, sample)));
    }
    EXPECT_NEAR(total / kSamples, spec.mask_prob * static_cast<double>(length),
                6 * 0.5 / std::sqrt(kSamples))
        << "L " << length;
  }
}

TEST(MaskSampleTest, TargetsAreTheOriginalExactlyAtChosenPositions) {
  const MaskedLmSpec spec = Spec(1000);
  const std::vector<int32_t> tokens = Tokens(512, 1000);
  for (uint64_t sample = 0; sample < 100; ++sample) {
    const Masked masked = Mask(spec, sample, tokens);
    for (size_t p = 0; p < tokens.size(); ++p) {
      if (masked.targets[p] == -1) {
        // Unchosen: unchanged, no loss.
        ASSERT_EQ(masked.inputs[p], tokens[p]) << "sample " << sample << ", position " << p;
      } else {
        ASSERT_EQ(masked.targets[p], tokens[p]) << "sample " << sample << ", position " << p;
        ASSERT_GE(masked.inputs[p], 0);
        ASSERT_LT(masked.inputs[p], spec.vocab_size);
      }
    }
  }
}

// Over the chosen positions of S = 2000 samples of L = 512 (N ~ p L S = 153,600 of them at
// p = 0.15), the outcomes are multinomial: an input equal to <mask> with probability
// q_mask = 1 - r - k, equal to the original with q_same = k + r / (V - 1) (a random token can
// redraw the original), and another token with q_other = r (V - 2) / (V - 1), for
// random_token_prob r, leave_unmasked_prob k and V = vocab_size. Each count is Binomial(N, q)
// given N, sd = sqrt(N q (1 - q)) (~118 for q = 0.1, ~157 for 0.8); 6 of them bound a correct
// implementation's false failure below 1e-8 (normal approximation, N q (1 - q) >= 1e4), while
// swapped roles or a probability off by a tenth of itself miss by more than 10 sd.
// Each position is also chosen about p S times: Binomial(S, p) as E[n] / L = p exactly, sd ~16.
void ExpectOutcomeProportions(double mask_prob, double random_token_prob,
                              double leave_unmasked_prob) {
  constexpr int64_t kLength = 512, kSamples = 2000, kVocab = 1000;
  MaskedLmSpec spec = Spec(kVocab);
  spec.mask_prob = mask_prob;
  spec.random_token_prob = random_token_prob;
  spec.leave_unmasked_prob = leave_unmasked_prob;
  const std::vector<int32_t> tokens = Tokens(kLength, kVocab);
  int64_t chosen = 0, masked_count = 0, same = 0, other = 0;
  std::vector<int64_t> per_position(kLength, 0);
  for (uint64_t sample = 0; sample < kSamples; ++sample) {
    const Masked masked = Mask(spec, sample, tokens);
    for (int64_t p = 0; p < kLength; ++p) {
      if (masked.targets[p] == -1) continue;
      ++chosen;
      ++per_position[p];
      if (masked.inputs[p] == spec.mask_token) {
        ++masked_count;
      } else if (masked.inputs[p] == tokens[p]) {
        ++same;
      } else {
        ++other;
      }
    }
  }
  const double n = static_cast<double>(chosen);
  const auto expect_share = [n](const char* what, int64_t count, double q) {
    EXPECT_NEAR(static_cast<double>(count), n * q, 6 * std::sqrt(n * q * (1 - q)) + 1e-9)
        << what << " of " << n << " chosen";
  };
  const double r = random_token_prob, k = leave_unmasked_prob;
  expect_share("<mask>", masked_count, 1 - r - k);
  expect_share("unchanged", same, k + r / (kVocab - 1));
  expect_share("replaced", other, r * (kVocab - 2) / (kVocab - 1));
  const double q = mask_prob;
  const double sd = std::sqrt(kSamples * q * (1 - q));
  for (int64_t p = 0; p < kLength; ++p) {
    EXPECT_NEAR(static_cast<double>(per_position[p]), kSamples * q, 6 * sd) << "position " << p;
  }
}

TEST(MaskSampleTest, OutcomesAreRobertas80_10_10) { ExpectOutcomeProportions(0.15, 0.1, 0.1); }
TEST(MaskSampleTest, OutcomesFollowOtherRates) { ExpectOutcomeProportions(0.3, 0.25, 0.05); }
TEST(MaskSampleTest, AllMaskWhenNeitherRandomNorKept) { ExpectOutcomeProportions(0.15, 0, 0); }

// With random_token_prob 1 every chosen input is a random replacement: never <mask>, wherever
// <mask> sits in the vocabulary, and uniform over the other V - 1 = 7 ids. Each id's count is
// Binomial(N, 1/7) for N ~ 0.5 x 256 x 400 = 51,200 replacements: sd ~79, bound 6 sd.
TEST(MaskSampleTest, RandomReplacementsAreUniformAndNeverMask) {
  constexpr int64_t kVocab = 8, kLength = 256, kSamples = 400;
  for (const int32_t mask_token : {0, 3, 7}) {
    const MaskedLmSpec spec{.mask_prob = 0.5,
                            .random_token_prob = 1,
                            .leave_unmasked_prob = 0,
                            .mask_token = mask_token,
                            .vocab_size = kVocab,
                            .seed = kSeed};
    const std::vector<int32_t> tokens = Tokens(kLength, kVocab);
    std::vector<int64_t> counts(kVocab, 0);
    int64_t n = 0;
    for (uint64_t sample = 0; sample < kSamples; ++sample) {
      const Masked masked = Mask(spec, sample, tokens);
      for (int64_t p = 0; p < kLength; ++p) {
        if (masked.targets[p] == -1) continue;
        ASSERT_NE(masked.inputs[p], mask_token) << "sample " << sample << ", position " << p;
        ++counts[masked.inputs[p]];
        ++n;
      }
    }
    const double q = 1.0 / (kVocab - 1);
    for (int32_t id = 0; id < kVocab; ++id) {
      if (id == mask_token) continue;
      EXPECT_NEAR(static_cast<double>(counts[id]), n * q, 6 * std::sqrt(n * q * (1 - q)))
          << "id " << id << ", <mask> " << mask_token;
    }
  }
}

// A vocabulary of two: the one id that is not <mask> is every random replacement.
TEST(MaskSampleTest, TwoTokenVocabularyReplacesWithTheOtherId) {
  const MaskedLmSpec spec{.mask_prob = 1,
                          .random_token_prob = 1,
                          .leave_unmasked_prob = 0,
                          .mask_token = 0,
                          .vocab_size = 2,
                          .seed = kSeed};
  const std::vector<int32_t> tokens(64, 0);
  const Masked masked = Mask(spec, 3, tokens);
  EXPECT_EQ(masked.inputs, std::vector<int32_t>(64, 1));
  EXPECT_EQ(masked.targets, tokens);
}

TEST(MaskSampleTest, IsAPureFunctionOfSeedAndSample) {
  const MaskedLmSpec spec = Spec(1000);
  const std::vector<int32_t> tokens = Tokens(128, 1000);
  constexpr int kSamples = 64;
  // In order, then in reverse and interleaved with other samples: the same masks.
  std::vector<Masked> forward;
  for (uint64_t sample = 0; sample < kSamples; ++sample) {
    forward.push_back(Mask(spec, sample, tokens));
  }
  for (uint64_t sample = kSamples; sample-- > 0;) {
    Mask(spec, 1000 + sample, tokens);
    EXPECT_EQ(Mask(spec, sample, tokens), forward[sample]) << "sample " << sample;
  }
  // Another sample, a sample 2^32 further on (the index's high word), or another seed: other
  // chosen positions (identical ones would have probability ~C(128, 19)^-1).
  for (uint64_t sample = 1; sample < kSamples; ++sample) {
    EXPECT_NE(forward[sample].targets, forward[0].targets) << "sample " << sample;
  }
  EXPECT_NE(Mask(spec, uint64_t{1} << 32, tokens).targets, forward[0].targets);
  MaskedLmSpec reseeded = spec;
  reseeded.seed = kSeed + 1;
  EXPECT_NE(Mask(reseeded, 0, tokens).targets, forward[0].targets);
}

}  // namespace
}  // namespace nf::data
