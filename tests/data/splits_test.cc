// Tests of data/splits.h: split strings parse into normalised weights of any number of parts,
// ranges are consecutive, proportional (rounding half to even, like Megatron's Python) and
// cover every document, and bad strings get a one-line error quoting the string.
#include "data/splits.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace nf::data {
namespace {

using ::nf::testing::ExpectInvalidArgument;
using ::testing::DoubleNear;
using ::testing::ElementsAre;

std::vector<DocumentRange> MustSplit(const std::string& split, int64_t num_documents) {
  absl::StatusOr<std::vector<DocumentRange>> ranges = ParseSplit(split, num_documents);
  NF_EXPECT_OK(ranges);
  return ranges.ok() ? *ranges : std::vector<DocumentRange>{};
}

DocumentRange R(int64_t begin, int64_t end) { return {.begin = begin, .end = end}; }

TEST(SplitsTest, ParsesAndNormalisesWeights) {
  const absl::StatusOr<std::vector<double>> weights = ParseSplitWeights("969,30,1");
  NF_ASSERT_OK(weights);
  EXPECT_THAT(*weights, ElementsAre(DoubleNear(0.969, 1e-15), DoubleNear(0.030, 1e-15),
                                    DoubleNear(0.001, 1e-15)));
  // Whitespace around parts, fractions and exponents are numbers too.
  const absl::StatusOr<std::vector<double>> spaced = ParseSplitWeights(" 0.5 , 1e0,0.5 ");
  NF_ASSERT_OK(spaced);
  EXPECT_THAT(*spaced, ElementsAre(0.25, 0.5, 0.25));
}

TEST(SplitsTest, RangesAreProportionalAndConsecutive) {
  EXPECT_THAT(MustSplit("969,30,1", 1000), ElementsAre(R(0, 969), R(969, 999), R(999, 1000)));
  EXPECT_THAT(MustSplit("98,2,0", 100), ElementsAre(R(0, 98), R(98, 100), R(100, 100)));
  EXPECT_THAT(MustSplit("1", 7), ElementsAre(R(0, 7)));
  EXPECT_THAT(MustSplit("0,1", 7), ElementsAre(R(0, 0), R(0, 7)));
  // Boundaries 2.5, 5 and 7.5 round half to even: 2, 5, 8.
  EXPECT_THAT(MustSplit("1,1,1,1", 10), ElementsAre(R(0, 2), R(2, 5), R(5, 8), R(8, 10)));
  // More parts than documents: some are empty, all are consecutive.
  EXPECT_THAT(MustSplit("1,1,1,1,1", 2), ElementsAre(R(0, 0), R(0, 1), R(1, 1), R(1, 2), R(2, 2)));
  EXPECT_THAT(MustSplit("3,1", 0), ElementsAre(R(0, 0), R(0, 0)));
}

TEST(SplitsTest, RandomSplitsCoverEveryDocumentWithinOneOfTheirShare) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int parts = 1 + static_cast<int>(rng() % 6);
    std::vector<double> raw(parts);
    double total = 0.0;
    for (double& w : raw) total += (w = static_cast<double>(rng() % 1000));
    if (total == 0.0) continue;
    std::vector<double> weights;
    for (const double w : raw) weights.push_back(w / total);
    const int64_t n = rng() % 100000;
    const std::vector<DocumentRange> ranges = SplitDocuments(weights, n);
    ASSERT_EQ(ranges.size(), static_cast<size_t>(parts));
    ASSERT_EQ(ranges.front().begin, 0);
    ASSERT_EQ(ranges.back().end, n);
    double before = 0.0;
    for (int k = 0; k < parts; ++k) {
      if (k > 0) {
        ASSERT_EQ(ranges[k].begin, ranges[k - 1].end);
      }
      ASSERT_LE(ranges[k].begin, ranges[k].end);
      before += weights[k];
      // Each boundary is the rounded cumulative share.
      EXPECT_LE(std::abs(static_cast<double>(ranges[k].end) - before * n), 0.5 + 1e-6)
          << "trial " << trial << ", part " << k;
    }
  }
}

TEST(SplitsTest, BadStringsNameTheStringAndTheProblem) {
  ExpectInvalidArgument(ParseSplitWeights("").status(), "data: split \"\": no weights");
  ExpectInvalidArgument(ParseSplitWeights("  ").status(), "no weights");
  ExpectInvalidArgument(ParseSplitWeights("969,,1").status(),
                        "data: split \"969,,1\": part 2 is empty");
  ExpectInvalidArgument(ParseSplitWeights("1,2,").status(), "part 3 is empty");
  ExpectInvalidArgument(ParseSplitWeights("969,x,1").status(), "part 2 (\"x\") is not a number");
  ExpectInvalidArgument(ParseSplitWeights("9 1").status(), "part 1 (\"9 1\") is not a number");
  ExpectInvalidArgument(ParseSplitWeights("1,-2").status(), "part 2 (\"-2\") must be a finite");
  ExpectInvalidArgument(ParseSplitWeights("inf,1").status(), "part 1 (\"inf\") must be a finite");
  ExpectInvalidArgument(ParseSplitWeights("nan").status(), "part 1 (\"nan\") must be a finite");
  ExpectInvalidArgument(ParseSplitWeights("0,0").status(), "data: split \"0,0\": the weights");
  ExpectInvalidArgument(ParseSplitWeights("1e308,1e308").status(), "finite, positive sum");
  ExpectInvalidArgument(ParseSplit("1,,1", 10).status(), "part 2 is empty");
  // One line.
  const absl::Status status = ParseSplitWeights("969,x,1").status();
  EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos);
}

}  // namespace
}  // namespace nf::data
