// Tests of data/synthetic_corpus.h: samples are a pure function of (seed, index), every
// transition follows a fixed successor table of `branching` distinct successors per token, each
// followed about equally often, tokens stay in the vocabulary, and bad settings are rejected.
#include "data/synthetic_corpus.h"

#include <cstdint>
#include <cstdlib>
#include <set>
#include <utility>
#include <vector>

#include "test_util.h"

namespace nf::data {
namespace {

using ::nf::testing::ExpectInvalidArgument;

constexpr int64_t kVocab = 64;
constexpr uint32_t kSeed = 1234;

SyntheticCorpus MakeCorpus(int64_t vocab, int branching, uint32_t seed) {
  absl::StatusOr<SyntheticCorpus> corpus = SyntheticCorpus::Create(vocab, branching, seed);
  NF_EXPECT_OK(corpus);
  if (!corpus.ok()) std::abort();
  return *std::move(corpus);
}

std::vector<int32_t> SampleOf(const SyntheticCorpus& corpus, uint64_t index, int64_t length) {
  std::vector<int32_t> tokens(length, -1);
  corpus.Sample(index, length, tokens.data());
  return tokens;
}

// transitions[t][u] = how often u followed t in the first two tokens of samples
// [0, num_samples). A sample's first token is uniform over the vocabulary and its first choice
// independent of it, so every token is observed ~num_samples / vocab times, unlike along a
// sample, where the chain's stationary distribution favours some tokens and may never reach
// others.
std::vector<std::vector<int64_t>> FirstTransitions(const SyntheticCorpus& corpus, int num_samples) {
  const int64_t vocab = corpus.vocab_size();
  std::vector<std::vector<int64_t>> transitions(vocab, std::vector<int64_t>(vocab, 0));
  for (int index = 0; index < num_samples; ++index) {
    const std::vector<int32_t> tokens = SampleOf(corpus, index, 2);
    ++transitions[tokens[0]][tokens[1]];
  }
  return transitions;
}

// successors[t] = the tokens observed after t.
std::vector<std::set<int32_t>> ObservedSuccessors(const SyntheticCorpus& corpus, int num_samples) {
  const std::vector<std::vector<int64_t>> transitions = FirstTransitions(corpus, num_samples);
  std::vector<std::set<int32_t>> successors(transitions.size());
  for (size_t token = 0; token < transitions.size(); ++token) {
    for (size_t next = 0; next < transitions[token].size(); ++next) {
      if (transitions[token][next] > 0) successors[token].insert(static_cast<int32_t>(next));
    }
  }
  return successors;
}

TEST(SyntheticCorpusTest, SamplesArePureFunctionsOfSeedAndIndex) {
  const SyntheticCorpus corpus = MakeCorpus(kVocab, 2, kSeed);
  const SyntheticCorpus twin = MakeCorpus(kVocab, 2, kSeed);
  const std::vector<int32_t> first = SampleOf(corpus, 7, 32);
  // Drawing other samples in between changes nothing: there is no hidden generator state.
  SampleOf(corpus, 123456789, 32);
  EXPECT_EQ(SampleOf(corpus, 7, 32), first);
  EXPECT_EQ(SampleOf(twin, 7, 32), first);
  // A far index (beyond 32 bits) is a sample of its own too.
  EXPECT_EQ(SampleOf(corpus, uint64_t{1} << 40, 32), SampleOf(twin, uint64_t{1} << 40, 32));

  // Another index or another seed gives another sample. Two independent samples of 32 tokens
  // agree only if their first tokens (1/64) and all 31 choices (1/2 each) agree: 2^-37.
  EXPECT_NE(SampleOf(corpus, 8, 32), first);
  EXPECT_NE(SampleOf(corpus, uint64_t{7} + (uint64_t{1} << 32), 32), first);
  EXPECT_NE(SampleOf(MakeCorpus(kVocab, 2, kSeed + 1), 7, 32), first);
}

TEST(SyntheticCorpusTest, ShorterSampleIsPrefixOfLongerOne) {
  // The trainer asks for seq_len + 1 tokens; a sample must not depend on how many are asked.
  const SyntheticCorpus corpus = MakeCorpus(kVocab, 3, kSeed);
  const std::vector<int32_t> longer = SampleOf(corpus, 11, 40);
  const std::vector<int32_t> shorter = SampleOf(corpus, 11, 17);
  EXPECT_EQ(shorter, std::vector<int32_t>(longer.begin(), longer.begin() + 17));
}

TEST(SyntheticCorpusTest, NonPositiveLengthWritesNothing) {
  const SyntheticCorpus corpus = MakeCorpus(kVocab, 2, kSeed);
  int32_t sentinel = -7;
  corpus.Sample(0, 0, &sentinel);
  corpus.Sample(0, -3, &sentinel);
  EXPECT_EQ(sentinel, -7);
}

TEST(SyntheticCorpusTest, TokensStayInVocabulary) {
  // A vocabulary that is not a power of two, so that a modulo slip would show.
  for (const int64_t vocab : {int64_t{1}, int64_t{5}, int64_t{100}}) {
    const SyntheticCorpus corpus = MakeCorpus(vocab, 1, kSeed);
    for (uint64_t index = 0; index < 50; ++index) {
      for (const int32_t token : SampleOf(corpus, index, 64)) {
        ASSERT_GE(token, 0) << "vocab " << vocab;
        ASSERT_LT(token, vocab) << "vocab " << vocab;
      }
    }
  }
}

TEST(SyntheticCorpusTest, TransitionsAlongSamplesFollowOneTable) {
  // Whatever sample or position a transition comes from, it is one of the `branching`
  // successors of its token: never more distinct ones than that across 1000 samples of 64.
  for (const int branching : {1, 2, 5}) {
    const SyntheticCorpus corpus = MakeCorpus(kVocab, branching, kSeed);
    std::vector<std::set<int32_t>> successors(kVocab);
    for (uint64_t index = 0; index < 1000; ++index) {
      const std::vector<int32_t> tokens = SampleOf(corpus, index, 64);
      for (int i = 1; i < 64; ++i) successors[tokens[i - 1]].insert(tokens[i]);
    }
    for (int64_t token = 0; token < kVocab; ++token) {
      EXPECT_LE(successors[token].size(), static_cast<size_t>(branching))
          << "token " << token << " with branching " << branching;
    }
    // The first-transition table below sees the same successors.
    const std::vector<std::set<int32_t>> first = ObservedSuccessors(corpus, 64 * 200);
    for (int64_t token = 0; token < kVocab; ++token) {
      for (const int32_t next : successors[token]) {
        EXPECT_TRUE(first[token].contains(next)) << token << " -> " << next;
      }
    }
  }
}

TEST(SyntheticCorpusTest, EveryTokenHasExactlyBranchingDistinctSuccessors) {
  // 64 x 200 two-token samples: ~200 transitions from each token (binomial, standard deviation
  // 14). A successor of probability 1/branching >= 1/8 is missed with probability below
  // (7/8)^130 ~ 3e-8 even at 5 standard deviations below the mean, so a token with fewer
  // observed successors has fewer real ones: each token needs `branching` distinct successors
  // for the best loss to be ln(branching).
  for (const int branching : {1, 2, 3, 8}) {
    const SyntheticCorpus corpus = MakeCorpus(kVocab, branching, kSeed);
    const std::vector<std::set<int32_t>> successors = ObservedSuccessors(corpus, 64 * 200);
    for (int64_t token = 0; token < kVocab; ++token) {
      EXPECT_EQ(successors[token].size(), static_cast<size_t>(branching))
          << "token " << token << " with branching " << branching;
    }
  }
}

TEST(SyntheticCorpusTest, BranchingEqualToVocabularyReachesEveryToken) {
  // Distinct successors drawn from the whole vocabulary: all of it. ~1000 transitions per
  // token, each successor 1/8: one is missed with probability ~(7/8)^1000.
  const SyntheticCorpus corpus = MakeCorpus(8, 8, kSeed);
  const std::vector<std::set<int32_t>> successors = ObservedSuccessors(corpus, 8000);
  for (int64_t token = 0; token < 8; ++token) {
    EXPECT_EQ(successors[token].size(), 8u) << "token " << token;
  }
}

TEST(SyntheticCorpusTest, SuccessorsAreFollowedWithEqualProbability) {
  // The best achievable loss is ln(branching) only if each successor has probability
  // 1/branching. From 64 x 2000 two-token samples, ~2000 transitions per token (asserted
  // >= 1500), one successor's frequency has standard deviation sqrt(p (1 - p) / n) <= 0.0122
  // for p = 1/3; 0.065 (5.3 standard deviations) over 64 x 3 frequencies is exceeded by chance
  // with probability ~1e-5 (and the data is fixed by the seed), while a successor drawn twice
  // into a token's table (p = 2/3) is off by 1/3. Branching 3 with this seed is where the
  // table once held such duplicates.
  constexpr int kBranching = 3;
  const SyntheticCorpus corpus = MakeCorpus(kVocab, kBranching, kSeed);
  const std::vector<std::vector<int64_t>> counts = FirstTransitions(corpus, 64 * 2000);
  for (int64_t token = 0; token < kVocab; ++token) {
    int64_t total = 0;
    for (const int64_t count : counts[token]) total += count;
    ASSERT_GE(total, 1500) << "token " << token << " too rare for the bound below";
    for (int64_t next = 0; next < kVocab; ++next) {
      if (counts[token][next] == 0) continue;
      const double frequency =
          static_cast<double>(counts[token][next]) / static_cast<double>(total);
      EXPECT_NEAR(frequency, 1.0 / kBranching, 0.065) << token << " -> " << next;
    }
  }
}

TEST(SyntheticCorpusTest, SuccessorTableDependsOnSeed) {
  // Two seeds give two chains: with 64 tokens x 2 successors drawn independently, the tables
  // coincide with probability ~(2/64^2)^64.
  const std::vector<std::set<int32_t>> a = ObservedSuccessors(MakeCorpus(kVocab, 2, 1), 6400);
  const std::vector<std::set<int32_t>> b = ObservedSuccessors(MakeCorpus(kVocab, 2, 2), 6400);
  EXPECT_NE(a, b);
}

TEST(SyntheticCorpusTest, RejectsBranchingOutsideOneToVocabulary) {
  for (const int branching : {0, -1, static_cast<int>(kVocab) + 1}) {
    ExpectInvalidArgument(SyntheticCorpus::Create(kVocab, branching, kSeed).status(),
                          "data.synthetic.branching");
  }
  for (const int branching : {1, static_cast<int>(kVocab)}) {
    const absl::StatusOr<SyntheticCorpus> corpus =
        SyntheticCorpus::Create(kVocab, branching, kSeed);
    NF_ASSERT_OK(corpus);
    EXPECT_EQ(corpus->branching(), branching);
    EXPECT_EQ(corpus->vocab_size(), kVocab);
  }
}

}  // namespace
}  // namespace nf::data
