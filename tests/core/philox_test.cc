// Tests of core/philox.h: Philox4x32-10 against the Random123 known-answer vectors, the
// coordinate keying of DropoutWords, and the keep probability of DropoutThreshold.
#include "core/philox.h"

#include <cmath>
#include <cstdint>
#include <set>

#include "gtest/gtest.h"

namespace nf {
namespace {

// Known-answer vectors from Random123's kat_vectors ("philox4x32 10"): counter, key -> output.
TEST(PhiloxTest, KnownAnswerZero) {
  const PhiloxCounter expected = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
  EXPECT_EQ(Philox4x32_10({0, 0, 0, 0}, {0, 0}), expected);
}

TEST(PhiloxTest, KnownAnswerAllOnes) {
  const PhiloxCounter expected = {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu};
  EXPECT_EQ(Philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            expected);
}

TEST(PhiloxTest, KnownAnswerPi) {
  const PhiloxCounter expected = {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u};
  EXPECT_EQ(Philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            expected);
}

// DropoutWords is documented as Philox with key {seed, site} and counter
// {col / 4, row, head, sample}.
TEST(PhiloxTest, DropoutWordsLayout) {
  const uint32_t seed = 1234, site = 17;
  const uint64_t sample = 5, head = 3, row = 99, col = 42;
  EXPECT_EQ(DropoutWords(seed, site, sample, head, row, col),
            Philox4x32_10({static_cast<uint32_t>(col / 4), static_cast<uint32_t>(row),
                           static_cast<uint32_t>(head), static_cast<uint32_t>(sample)},
                          {seed, site}));
}

TEST(PhiloxTest, DropoutWordsDependOnEveryCoordinate) {
  const uint32_t seed = 42, site = 7;
  const uint64_t sample = 11, head = 2, row = 300, col = 64;
  const PhiloxCounter base = DropoutWords(seed, site, sample, head, row, col);
  // The same coordinates give the same words (a pure function).
  EXPECT_EQ(DropoutWords(seed, site, sample, head, row, col), base);
  // Changing any one coordinate changes all four words (with probability 1 - 4 * 2^-32 for a
  // good generator; these fixed inputs are checked to differ in every word).
  const PhiloxCounter changed[] = {
      DropoutWords(seed + 1, site, sample, head, row, col),
      DropoutWords(seed, site + 1, sample, head, row, col),
      DropoutWords(seed, site, sample + 1, head, row, col),
      DropoutWords(seed, site, sample, head + 1, row, col),
      DropoutWords(seed, site, sample, head, row + 1, col),
      DropoutWords(seed, site, sample, head, row, col + 4),  // the next block of 4 columns
  };
  const char* kWhat[] = {"seed", "site", "sample", "head", "row", "col block"};
  for (int i = 0; i < 6; ++i) {
    for (int w = 0; w < 4; ++w) {
      EXPECT_NE(changed[i][w], base[w]) << "changing " << kWhat[i] << ", word " << w;
    }
  }
  // All of them differ from each other too (no two coordinates alias).
  std::set<PhiloxCounter> distinct(std::begin(changed), std::end(changed));
  distinct.insert(base);
  EXPECT_EQ(distinct.size(), 7u);
}

TEST(PhiloxTest, ColumnsOfOneBlockShareOneCall) {
  const uint32_t seed = 3, site = 1;
  for (uint64_t block = 0; block < 64; ++block) {
    const PhiloxCounter words = DropoutWords(seed, site, 0, 0, 5, 4 * block);
    // col & ~3 selects the call: columns 4b .. 4b+3 all get the same 4 words...
    for (uint64_t c = 4 * block; c < 4 * block + 4; ++c) {
      EXPECT_EQ(DropoutWords(seed, site, 0, 0, 5, c), words) << "col " << c;
    }
    // ...and each column takes its own word (col & 3) of it: neighbours in a group differ.
    for (int lane = 0; lane + 1 < 4; ++lane) {
      EXPECT_NE(words[lane], words[lane + 1]) << "block " << block << ", lane " << lane;
    }
    EXPECT_NE(DropoutWords(seed, site, 0, 0, 5, 4 * block + 4), words) << "block " << block;
  }
}

TEST(PhiloxTest, DropoutThresholdValues) {
  EXPECT_EQ(DropoutThreshold(0.0f), 0u);
  EXPECT_EQ(DropoutThreshold(0.5f), 0x80000000u);
  EXPECT_EQ(DropoutThreshold(0.25f), 0x40000000u);
  // 0.1f is 0.100000001490116...: threshold floor(0.1f * 2^32) = 429496736.
  EXPECT_EQ(DropoutThreshold(0.1f), 429496736u);
  // Monotone in p.
  uint32_t previous = 0;
  for (int i = 1; i < 1000; ++i) {
    const uint32_t t = DropoutThreshold(i / 1000.0f);
    EXPECT_GT(t, previous) << i;
    previous = t;
  }
}

TEST(PhiloxTest, ZeroDropoutKeepsEverything) {
  const uint32_t threshold = DropoutThreshold(0.0f);
  ASSERT_EQ(threshold, 0u);
  // kept <=> word >= threshold, which every word (including 0) satisfies.
  for (uint32_t word : {0u, 1u, 0x7FFFFFFFu, 0xFFFFFFFFu}) EXPECT_GE(word, threshold);
  for (uint64_t col = 0; col < 4096; col += 4) {
    for (uint32_t word : DropoutWords(9, 9, 0, 0, 0, col)) ASSERT_GE(word, threshold);
  }
}

// The empirical keep fraction over n = 2^20 words (2^18 Philox calls over a grid of
// coordinates) must match q = 1 - p (the threshold's quantisation to 2^-32 shifts the mean by
// under 2^-12 counts, nothing next to the bound). For independent uniform words the kept
// count is Binomial(n, q) with standard deviation sqrt(n q (1 - q)) (<= 512 here); a deviation
// beyond 6 of them has probability < 2e-9 (normal approximation, excellent at n q (1-q) >= 9e4),
// so a correct generator passes for essentially any seed, while a biased one (e.g. a word with
// a stuck bit, or a threshold off by a factor) fails by hundreds of deviations.
void ExpectKeepFraction(float p, uint32_t seed) {
  const uint32_t threshold = DropoutThreshold(p);
  const double q = 1.0 - static_cast<double>(p);
  int64_t n = 0, kept = 0;
  int64_t kept_per_lane[4] = {0, 0, 0, 0};
  for (uint64_t sample = 0; sample < 4; ++sample) {
    for (uint64_t head = 0; head < 4; ++head) {
      for (uint64_t row = 0; row < 128; ++row) {
        for (uint64_t col = 0; col < 512; col += 4) {
          const PhiloxCounter words = DropoutWords(seed, /*site=*/5, sample, head, row, col);
          for (int lane = 0; lane < 4; ++lane) {
            const bool keep = words[lane] >= threshold;
            kept += keep;
            kept_per_lane[lane] += keep;
            ++n;
          }
        }
      }
    }
  }
  ASSERT_EQ(n, int64_t{1} << 20);
  const double sd = std::sqrt(n * q * (1 - q));
  EXPECT_NEAR(static_cast<double>(kept), n * q, 6 * sd) << "p=" << p;
  // Each of the 4 words of a call separately (n/4 draws each, same 6-sigma argument).
  const double lane_sd = std::sqrt(n / 4 * q * (1 - q));
  for (int lane = 0; lane < 4; ++lane) {
    EXPECT_NEAR(static_cast<double>(kept_per_lane[lane]), n / 4 * q, 6 * lane_sd)
        << "p=" << p << ", lane " << lane;
  }
}

TEST(PhiloxTest, KeepFractionP01) { ExpectKeepFraction(0.1f, 2024); }
TEST(PhiloxTest, KeepFractionP05) { ExpectKeepFraction(0.5f, 77); }

// Every bit of the words is fair: each of the 32 bit positions is set in about half of 2^18
// words (sd = 256; the 6-sigma bound as above, over 32 positions still < 1e-7 total false-failure
// probability).
TEST(PhiloxTest, EveryBitIsBalanced) {
  int64_t ones[32] = {};
  int64_t n = 0;
  for (uint64_t row = 0; row < 256; ++row) {
    for (uint64_t col = 0; col < 1024; col += 4) {
      for (uint32_t word : DropoutWords(1, 2, 3, 4, row, col)) {
        for (int bit = 0; bit < 32; ++bit) ones[bit] += (word >> bit) & 1u;
        ++n;
      }
    }
  }
  ASSERT_EQ(n, int64_t{1} << 18);
  const double sd = std::sqrt(n * 0.25);
  for (int bit = 0; bit < 32; ++bit) {
    EXPECT_NEAR(static_cast<double>(ones[bit]), n / 2.0, 6 * sd) << "bit " << bit;
  }
}

}  // namespace
}  // namespace nf
