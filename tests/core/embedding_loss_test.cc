// Token embedding (local and vocab-parallel) and cross-entropy (local and vocab-parallel)
// against float64 references written here; the loss gradient against central finite
// differences of the reference loss.
//
// Error model behind the tolerances: inputs are rounded to their dtype before the test starts
// and the reference gets the same rounded values. The CPU cross-entropy keeps the row max and
// the target logit exact (they are input values). For fp32 logits each term exp(x - max) takes
// x - max in fp32 (u32 |x - max| absolute, so that much relative after exp) and the vectorised
// fp32 exp (kExpRel relative, core/cpu/isa/softmax_kernels.h); fp16 / bf16 take a double exp of
// the exact difference, within the same bound. The double sum of the terms is then within their
// exp-weighted mean error, and sum_exp is stored in fp32 (u32 = 2^-24 more): SumExpError below,
// which log(sum_exp) carries as an absolute error; the loss is then rounded to fp32 once more.
// Gradients stored as fp16 / bf16 add one rounding of relative error u = 2^-11 / 2^-8.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/cpu/isa/softmax_kernels.h"
#include "core/ops/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf {
namespace {

using ::nf::testing::ExpectAllClose;
using ::nf::testing::ExpectInvalidArgument;
using ::nf::testing::kU32;
using ::nf::testing::MakeIds;
using ::nf::testing::MakeTensor;
using ::nf::testing::MakeZeros;
using ::nf::testing::MaxAbs;
using ::nf::testing::NumericGradient;
using ::nf::testing::RandomFloats;
using ::nf::testing::Rounded;
using ::nf::testing::ToDoubles;
using ::nf::testing::UnitRoundoff;

constexpr double kFdError = 1e-8;  // central differences in double, h = 1e-5, O(1-10) losses
constexpr double kExpRel = 2 * cpu::kExpMaxUlps * kU32;  // the fp32 exp's relative error

std::string Name(const ::testing::TestParamInfo<DType>& info) {
  return std::string(DTypeName(info.param));
}

// ---- Embedding ---------------------------------------------------------------------------------

class EmbeddingDTypeTest : public ::testing::TestWithParam<DType> {};
INSTANTIATE_TEST_SUITE_P(AllDTypes, EmbeddingDTypeTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16), Name);

TEST_P(EmbeddingDTypeTest, ForwardCopiesRows) {
  const DType dtype = GetParam();
  const int64_t vocab = 7, width = 5;
  const std::vector<double> table = Rounded(dtype, RandomFloats(vocab * width, 1));
  Tensor t = MakeTensor(dtype, {vocab, width}, std::vector<float>(table.begin(), table.end()));
  const std::vector<int32_t> ids = {0, 3, 6, 3, 1};
  Tensor out = MakeZeros(dtype, {5, width});
  NF_ASSERT_OK(ops::EmbeddingForward({MakeIds({5}, ids), t, out}));
  std::vector<double> expected;
  for (int32_t id : ids) {
    expected.insert(expected.end(), table.begin() + id * width, table.begin() + (id + 1) * width);
  }
  // A copy: exact.
  ExpectAllClose(ToDoubles(out), expected, 0.0, 0.0, "embedding out");
}

TEST_P(EmbeddingDTypeTest, BackwardAccumulatesRepeatedIds) {
  const DType dtype = GetParam();
  const int64_t vocab = 7, width = 4;
  const std::vector<int32_t> ids = {2, 5, 2, 0, 2, 6};  // id 2 three times; 1, 3, 4 never
  const int64_t tokens = ids.size();
  const std::vector<double> dout = Rounded(dtype, RandomFloats(tokens * width, 2));
  const std::vector<float> start = RandomFloats(vocab * width, 3);
  Tensor dtable = MakeTensor(DType::kF32, {vocab, width}, start);
  NF_ASSERT_OK(ops::EmbeddingBackward(
      MakeIds({tokens}, ids),
      MakeTensor(dtype, {tokens, width}, std::vector<float>(dout.begin(), dout.end())), dtable, 0));
  std::vector<double> expected(start.begin(), start.end());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < width; ++c) expected[ids[t] * width + c] += dout[t * width + c];
  }
  // Each of a row's (at most `tokens`) fp32 additions rounds within u32 of a partial sum no
  // larger than |start| + tokens max|dout|; untouched rows are exact.
  const double atol = tokens * kU32 * (1.0 + tokens * MaxAbs(dout));
  ExpectAllClose(ToDoubles(dtable), expected, atol, 0.0, "dtable");
  for (int64_t c = 0; c < width; ++c) {  // rows nobody hit keep their bits
    EXPECT_EQ(dtable.data<float>()[1 * width + c], start[1 * width + c]);
    EXPECT_EQ(dtable.data<float>()[4 * width + c], start[4 * width + c]);
  }
}

// Vocab-parallel: rank 0 holds ids [0, 6), rank 1 ids [6, 10). Each gives zeros for the other's
// ids, so the all-reduce (a sum) of the two outputs is the full table's output, and each
// slice's gradient is the full gradient's rows.
TEST(EmbeddingTest, VocabParallelSlicesSumToFullTable) {
  const int64_t vocab = 10, width = 3, split = 6;
  const std::vector<float> table = RandomFloats(vocab * width, 4);
  Tensor full = MakeTensor(DType::kF32, {vocab, width}, table);
  const std::vector<int32_t> ids = {0, 7, 5, 9, 6, 3, 7};
  const int64_t tokens = ids.size();
  Tensor tids = MakeIds({tokens}, ids);
  Tensor out_full = MakeZeros(DType::kF32, {tokens, width});
  NF_ASSERT_OK(ops::EmbeddingForward({tids, full, out_full}));

  const Tensor slices[2] = {*full.View(0, {split, width}),
                            *full.View(split * width, {vocab - split, width})};
  const int64_t offsets[2] = {0, split};
  std::vector<double> summed(tokens * width, 0.0);
  for (int s = 0; s < 2; ++s) {
    Tensor out = MakeTensor(DType::kF32, {tokens, width},
                            std::vector<float>(tokens * width, 123.0f));  // overwritten
    NF_ASSERT_OK(ops::EmbeddingForward({tids, slices[s], out, offsets[s], vocab}));
    const std::vector<double> got = ToDoubles(out);
    for (int64_t t = 0; t < tokens; ++t) {
      const bool mine = ids[t] >= offsets[s] && ids[t] < offsets[s] + slices[s].dim(0);
      for (int64_t c = 0; c < width; ++c) {
        // A copy or a zero: exact.
        EXPECT_EQ(got[t * width + c], mine ? table[ids[t] * width + c] : 0.0)
            << "slice " << s << " token " << t;
        summed[t * width + c] += got[t * width + c];
      }
    }
  }
  // x + 0 is exact, so the sum equals the unsharded output bit for bit.
  ExpectAllClose(summed, ToDoubles(out_full), 0.0, 0.0, "sum of slices");

  // Backward: the same rows, accumulated in the same token order, so bit-identical too.
  const std::vector<float> dout = RandomFloats(tokens * width, 5);
  const std::vector<float> start = RandomFloats(vocab * width, 6);
  Tensor tdout = MakeTensor(DType::kF32, {tokens, width}, dout);
  Tensor dfull = MakeTensor(DType::kF32, {vocab, width}, start);
  NF_ASSERT_OK(ops::EmbeddingBackward(tids, tdout, dfull, 0));
  const std::vector<double> dfull_d = ToDoubles(dfull);
  for (int s = 0; s < 2; ++s) {
    const int64_t rows = slices[s].dim(0);
    Tensor dslice = MakeTensor(DType::kF32, {rows, width},
                               std::vector<float>(start.begin() + offsets[s] * width,
                                                  start.begin() + (offsets[s] + rows) * width));
    NF_ASSERT_OK(ops::EmbeddingBackward(tids, tdout, dslice, offsets[s]));
    ExpectAllClose(ToDoubles(dslice),
                   std::vector<double>(dfull_d.begin() + offsets[s] * width,
                                       dfull_d.begin() + (offsets[s] + rows) * width),
                   0.0, 0.0, "slice dtable");
  }
}

// Enough tokens and rows that the kernels split the work into several thread-pool chunks
// (forward: ~1000 tokens of width 32 per chunk; backward: ~10 table rows per chunk, each
// scanning all tokens). Results must not depend on the split.
TEST(EmbeddingTest, ChunkedWorkMatchesReference) {
  const int64_t vocab = 64, width = 32, tokens = 3000;
  const std::vector<float> table = RandomFloats(vocab * width, 13);
  std::vector<int32_t> ids(tokens);
  for (int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<int32_t>((t * 37 + t / 7) % vocab);
  Tensor tids = MakeIds({tokens}, ids);
  Tensor out = MakeZeros(DType::kF32, {tokens, width});
  NF_ASSERT_OK(ops::EmbeddingForward({tids, MakeTensor(DType::kF32, {vocab, width}, table), out}));
  std::vector<double> expected;
  for (int32_t id : ids) {
    expected.insert(expected.end(), table.begin() + id * width, table.begin() + (id + 1) * width);
  }
  ExpectAllClose(ToDoubles(out), expected, 0.0, 0.0, "chunked out");  // copies: exact

  const std::vector<float> dout = RandomFloats(tokens * width, 14);
  Tensor dtable = MakeZeros(DType::kF32, {vocab, width});
  NF_ASSERT_OK(
      ops::EmbeddingBackward(tids, MakeTensor(DType::kF32, {tokens, width}, dout), dtable, 0));
  std::vector<double> sums(vocab * width, 0.0), magnitude(vocab * width, 0.0);
  std::vector<int64_t> hits(vocab, 0);
  for (int64_t t = 0; t < tokens; ++t) {
    ++hits[ids[t]];
    for (int64_t c = 0; c < width; ++c) {
      sums[ids[t] * width + c] += dout[t * width + c];
      magnitude[ids[t] * width + c] += std::abs(dout[t * width + c]);
    }
  }
  // A row hit n times takes n fp32 additions, each rounding within u32 of a partial sum no
  // larger than the sum of magnitudes: n u32 sum|dout| per element; the worst element bounds
  // the scalar tolerance.
  double atol = 0.0;
  for (int64_t i = 0; i < vocab * width; ++i) {
    atol = std::max(atol, hits[i / width] * kU32 * magnitude[i]);
  }
  ExpectAllClose(ToDoubles(dtable), sums, atol, 0.0, "chunked dtable");
}

TEST(EmbeddingTest, OutOfRangeIdIsAnErrorNamingTheId) {
  const int64_t vocab = 10, width = 2;
  Tensor table = MakeTensor(DType::kF32, {vocab, width}, RandomFloats(vocab * width, 7));
  Tensor out = MakeZeros(DType::kF32, {3, width});
  ExpectInvalidArgument(ops::EmbeddingForward({MakeIds({3}, {1, 12, 3}), table, out}), "12");
  ExpectInvalidArgument(ops::EmbeddingForward({MakeIds({3}, {1, 2, -3}), table, out}), "-3");
  ExpectInvalidArgument(ops::EmbeddingForward({MakeIds({3}, {1, 10, 3}), table, out}), "10");
  // In a slice, ids are checked against the global vocabulary, not the slice.
  Tensor slice = *table.View(6 * width, {4, width});
  NF_EXPECT_OK(ops::EmbeddingForward({MakeIds({3}, {1, 9, 0}), slice, out, 6, vocab}));
  ExpectInvalidArgument(ops::EmbeddingForward({MakeIds({3}, {1, 11, 0}), slice, out, 6, vocab}),
                        "11");
}

TEST(EmbeddingTest, RejectsInconsistentArguments) {
  const int64_t vocab = 10, width = 2;
  Tensor table = MakeZeros(DType::kF32, {vocab, width});
  Tensor ids = MakeIds({3}, {0, 1, 2});
  Tensor out = MakeZeros(DType::kF32, {3, width});
  NF_ASSERT_OK(ops::EmbeddingForward({ids, table, out}));
  ExpectInvalidArgument(ops::EmbeddingForward({MakeZeros(DType::kI64, {3}), table, out}), "ids");
  ExpectInvalidArgument(ops::EmbeddingForward({MakeIds({3, 1}, {0, 1, 2}), table, out}), "ids");
  ExpectInvalidArgument(ops::EmbeddingForward({ids, table, MakeZeros(DType::kF32, {3, width + 1})}),
                        "out");
  ExpectInvalidArgument(ops::EmbeddingForward({ids, table, MakeZeros(DType::kF16, {3, width})}),
                        "out");
  ExpectInvalidArgument(ops::EmbeddingForward({ids, MakeZeros(DType::kF32, {vocab}), out}),
                        "table");
  ExpectInvalidArgument(ops::EmbeddingForward({ids, table, out, -1, 12}), "vocab_offset");
  // A last slice [8, 18) of a padded table over a real vocabulary of 12 is fine: rows 12..17
  // are padding no id reaches.
  NF_EXPECT_OK(ops::EmbeddingForward({ids, table, out, 8, 12}));
  ExpectInvalidArgument(ops::EmbeddingBackward(ids, out, MakeZeros(DType::kF16, {vocab, width}), 0),
                        "dtable");
  ExpectInvalidArgument(ops::EmbeddingBackward(ids, MakeZeros(DType::kF32, {4, width}), table, 0),
                        "dout");
  ExpectInvalidArgument(ops::EmbeddingBackward(ids, out, table, -1), "vocab_offset");
}

// ---- Cross-entropy -----------------------------------------------------------------------------

// loss_r = logsumexp over the valid columns - logit of the target; 0 for target -1.
std::vector<double> ReferenceLoss(const std::vector<double>& logits, const std::vector<int32_t>& t,
                                  int64_t vocab, int64_t valid) {
  const int64_t rows = t.size();
  std::vector<double> loss(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] < 0) continue;
    double max = -INFINITY;
    for (int64_t c = 0; c < valid; ++c) max = std::max(max, logits[r * vocab + c]);
    double sum = 0.0;
    for (int64_t c = 0; c < valid; ++c) sum += std::exp(logits[r * vocab + c] - max);
    loss[r] = std::log(sum) + max - logits[r * vocab + t[r]];
  }
  return loss;
}

// The relative error bound of the fp32 sum_exp of the worst row (see the error model): over the
// valid columns, kExpRel + u32 times the exp-weighted mean of |x - max| (terms far below the max
// weigh nothing), plus u32 for storing the sum in fp32.
double SumExpError(const std::vector<double>& logits, int64_t vocab, int64_t valid) {
  double worst = 0.0;
  for (size_t r = 0; r < logits.size() / vocab; ++r) {
    const double* row = logits.data() + r * vocab;
    double max = -INFINITY, sum = 0.0, spread = 0.0;
    for (int64_t c = 0; c < valid; ++c) max = std::max(max, row[c]);
    for (int64_t c = 0; c < valid; ++c) {
      const double e = std::exp(row[c] - max);
      sum += e;
      if (e > 0.0) spread += e * (max - row[c]);
    }
    worst = std::max(worst, kExpRel + kU32 * (spread / sum + 1));
  }
  return worst;
}

// The absolute error bound of dlogits = dloss (p - onehot) for dloss <= max_dloss: p's relative
// error is sum_exp's (SumExpError), its own term's (kExpRel + u32 |x - max|, and p |x - max| <=
// 1/e as p <= exp(-|x - max|)) and two fp32 roundings (dloss / sum_exp, the product); p <= 1.
double GradError(double sum_exp_error, double max_dloss) {
  return max_dloss * (sum_exp_error + kExpRel + 3 * kU32);
}

struct LossResult {
  std::vector<double> loss, dlogits;
};

// CrossEntropyForward then CrossEntropyBackward on one rank.
LossResult RunCrossEntropy(const Tensor& logits, const std::vector<int32_t>& targets,
                           int64_t valid_vocab, const std::vector<float>& dloss) {
  const int64_t rows = targets.size();
  const ops::CrossEntropyArgs args{logits, MakeIds({rows}, targets), 0, valid_vocab};
  Tensor row_max = MakeZeros(DType::kF32, {rows});
  Tensor sum_exp = MakeZeros(DType::kF32, {rows});
  Tensor loss = MakeZeros(DType::kF32, {rows});
  const absl::Status forward = ops::CrossEntropyForward(args, row_max, sum_exp, loss);
  NF_EXPECT_OK(forward);
  Tensor dlogits = MakeZeros(logits.dtype(), logits.shape());
  const absl::Status backward = ops::CrossEntropyBackward(
      args, row_max, sum_exp, MakeTensor(DType::kF32, {rows}, dloss), dlogits);
  NF_EXPECT_OK(backward);
  return {ToDoubles(loss), ToDoubles(dlogits)};
}

class CrossEntropyDTypeTest : public ::testing::TestWithParam<DType> {};
INSTANTIATE_TEST_SUITE_P(AllDTypes, CrossEntropyDTypeTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16), Name);

TEST_P(CrossEntropyDTypeTest, MatchesReferenceAndFiniteDifferences) {
  const DType dtype = GetParam();
  const double u = UnitRoundoff(dtype);
  const int64_t rows = 6, vocab = 11;
  const std::vector<int32_t> targets = {3, 0, -1, 10, 7, 3};
  const std::vector<double> logits = Rounded(dtype, RandomFloats(rows * vocab, 8, -3.0f, 3.0f));
  const std::vector<float> dloss = RandomFloats(rows, 9, 0.5f, 2.0f);
  Tensor t = MakeTensor(dtype, {rows, vocab}, std::vector<float>(logits.begin(), logits.end()));
  const LossResult got = RunCrossEntropy(t, targets, 0, dloss);

  const std::vector<double> loss_ref = ReferenceLoss(logits, targets, vocab, vocab);
  // log(sum_exp) is within SumExpError of the exact value, max - target is exact, and the loss
  // is rounded to fp32: 2 u32 relative leaves a factor 2 of margin there.
  const double sum_error = SumExpError(logits, vocab, vocab);
  ExpectAllClose(got.loss, loss_ref, sum_error, 2 * kU32, "loss");
  EXPECT_EQ(got.loss[2], 0.0);  // ignored row

  const auto weighted = [&](const std::vector<double>& x) {
    const std::vector<double> loss = ReferenceLoss(x, targets, vocab, vocab);
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r) sum += dloss[r] * loss[r];
    return sum;
  };
  const std::vector<double> grad_ref = NumericGradient(weighted, logits, 1e-5);
  // g = dloss (p - onehot) within GradError, then the output rounding u.
  const double atol =
      GradError(sum_error, *std::max_element(dloss.begin(), dloss.end())) + kFdError;
  ExpectAllClose(got.dlogits, grad_ref, atol, u, "dlogits");
  for (int64_t c = 0; c < vocab; ++c) EXPECT_EQ(got.dlogits[2 * vocab + c], 0.0) << c;

  // dlogits may be the logits tensor itself: same values in place.
  const ops::CrossEntropyArgs args{t, MakeIds({rows}, targets)};
  Tensor row_max = MakeZeros(DType::kF32, {rows});
  Tensor sum_exp = MakeZeros(DType::kF32, {rows});
  Tensor loss = MakeZeros(DType::kF32, {rows});
  NF_ASSERT_OK(ops::CrossEntropyForward(args, row_max, sum_exp, loss));
  NF_ASSERT_OK(
      ops::CrossEntropyBackward(args, row_max, sum_exp, MakeTensor(DType::kF32, {rows}, dloss), t));
  ExpectAllClose(ToDoubles(t), got.dlogits, 0.0, 0.0, "in-place dlogits");
}

// Columns >= valid_vocab (vocabulary padding) never count, however large their logits.
TEST(CrossEntropyTest, PaddingColumnsAreExcluded) {
  const int64_t rows = 4, vocab = 8, valid = 6;
  const std::vector<int32_t> targets = {5, 0, 2, -1};
  std::vector<float> logits = RandomFloats(rows * vocab, 10, -2.0f, 2.0f);
  for (int64_t r = 0; r < rows; ++r) {
    logits[r * vocab + 6] = 50.0f;  // would dominate the softmax if it counted
    logits[r * vocab + 7] = -std::numeric_limits<float>::infinity();
  }
  const std::vector<float> dloss = {1.0f, 0.5f, 2.0f, 1.0f};
  const LossResult got =
      RunCrossEntropy(MakeTensor(DType::kF32, {rows, vocab}, logits), targets, valid, dloss);
  const std::vector<double> logits_d(logits.begin(), logits.end());
  // See MatchesReferenceAndFiniteDifferences for the loss and gradient tolerances.
  const double sum_error = SumExpError(logits_d, vocab, valid);
  ExpectAllClose(got.loss, ReferenceLoss(logits_d, targets, vocab, valid), sum_error, 2 * kU32,
                 "loss");
  const auto weighted = [&](const std::vector<double>& x) {
    const std::vector<double> loss = ReferenceLoss(x, targets, vocab, valid);
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r) sum += dloss[r] * loss[r];
    return sum;
  };
  // The reference ignores columns 6 and 7, so its finite-difference gradient there is 0.
  // GradError for max|dloss| = 2, then the fp32 output rounding u32.
  ExpectAllClose(got.dlogits, NumericGradient(weighted, logits_d, 1e-5),
                 GradError(sum_error, 2.0) + kFdError, kU32, "dlogits");
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(got.dlogits[r * vocab + 6], 0.0) << r;
    EXPECT_EQ(got.dlogits[r * vocab + 7], 0.0) << r;
  }
}

// 1100 rows of 64: every cross-entropy kernel splits the rows into several thread-pool chunks.
// Loss and gradient must match the float64 reference row by row (error model of
// MatchesReferenceAndFiniteDifferences; the gradient reference is the analytic
// dloss (softmax - onehot), which that test checks against finite differences).
TEST(CrossEntropyTest, ChunkedRowsMatchReference) {
  const int64_t rows = 1100, vocab = 64;
  const std::vector<float> logits = RandomFloats(rows * vocab, 15, -5.0f, 5.0f);
  const std::vector<float> dloss = RandomFloats(rows, 16, 0.5f, 2.0f);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = r % 13 == 0 ? -1 : (r * 29) % vocab;
  const LossResult got =
      RunCrossEntropy(MakeTensor(DType::kF32, {rows, vocab}, logits), targets, 0, dloss);
  const std::vector<double> logits_d(logits.begin(), logits.end());
  const double sum_error = SumExpError(logits_d, vocab, vocab);
  ExpectAllClose(got.loss, ReferenceLoss(logits_d, targets, vocab, vocab), sum_error, 2 * kU32,
                 "chunked loss");
  std::vector<double> expected(rows * vocab, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    double max = -INFINITY, sum = 0.0;
    for (int64_t c = 0; c < vocab; ++c) max = std::max(max, logits_d[r * vocab + c]);
    for (int64_t c = 0; c < vocab; ++c) sum += std::exp(logits_d[r * vocab + c] - max);
    for (int64_t c = 0; c < vocab; ++c) {
      expected[r * vocab + c] = dloss[r] * (std::exp(logits_d[r * vocab + c] - max) / sum -
                                            (c == targets[r] ? 1.0 : 0.0));
    }
  }
  // GradError for dloss <= 2, then the fp32 rounding.
  ExpectAllClose(got.dlogits, expected, GradError(sum_error, 2.0), kU32, "chunked dlogits");
}

TEST(CrossEntropyTest, HugeLogitsStayFiniteAndExact) {
  const int64_t rows = 4, vocab = 5;
  const std::vector<float> logits = {
      1e4f,  -1e4f, 9990.0f, 9999.0f, 0.0f,    // target 2: loss ~ 10.3
      1e4f,  1e4f,  1e4f,    1e4f,    1e4f,    // uniform: loss = log 5
      -1e4f, -1e4f, -1e4f,   -9e3f,   -1e4f,   // target 3 is the max: loss ~ 0
      3e4f,  -3e4f, 0.0f,    1.0f,    -1.0f};  // target 1: loss ~ 6e4
  const std::vector<int32_t> targets = {2, 0, 3, 1};
  const std::vector<float> dloss = {1.0f, 1.0f, 1.0f, 1.0f};
  const LossResult got =
      RunCrossEntropy(MakeTensor(DType::kF32, {rows, vocab}, logits), targets, 0, dloss);
  for (size_t i = 0; i < got.loss.size(); ++i) EXPECT_TRUE(std::isfinite(got.loss[i])) << i;
  for (size_t i = 0; i < got.dlogits.size(); ++i) EXPECT_TRUE(std::isfinite(got.dlogits[i])) << i;
  const std::vector<double> logits_d(logits.begin(), logits.end());
  // Same error model as for small logits: max - target is exact in double whatever the
  // magnitudes, and terms far below the max weigh nothing in SumExpError, so SumExpError
  // absolute (log of the fp32 sum_exp) + 2 u32 relative (the fp32 loss). The uniform row's
  // terms are all exp(0) = 1 exactly: log(5) then the fp32 sum and loss roundings.
  const double sum_error = SumExpError(logits_d, vocab, vocab);
  ExpectAllClose(got.loss, ReferenceLoss(logits_d, targets, vocab, vocab), sum_error, 2 * kU32,
                 "loss");
  EXPECT_NEAR(got.loss[1], std::log(5.0), 2 * kU32 * (1 + std::log(5.0)));
  // Gradients: softmax - onehot from a float64 softmax, within GradError for dloss = 1, then
  // the fp32 rounding (u32 relative).
  std::vector<double> expected(rows * vocab);
  for (int64_t r = 0; r < rows; ++r) {
    double max = -INFINITY, sum = 0.0;
    for (int64_t c = 0; c < vocab; ++c) max = std::max(max, logits_d[r * vocab + c]);
    for (int64_t c = 0; c < vocab; ++c) sum += std::exp(logits_d[r * vocab + c] - max);
    for (int64_t c = 0; c < vocab; ++c) {
      expected[r * vocab + c] =
          std::exp(logits_d[r * vocab + c] - max) / sum - (c == targets[r] ? 1.0 : 0.0);
    }
  }
  ExpectAllClose(got.dlogits, expected, GradError(sum_error, 1.0), kU32, "dlogits");
}

// Vocab-parallel cross-entropy over column slices: the documented sequence RowMax -> all-reduce
// max -> SumExp -> all-reduce sums -> Loss, simulated here, matches the unsplit op; so does the
// variant where each slice sums with its own max and the sums are re-based to the global max.
struct SplitCase {
  std::vector<int64_t> bounds;  // slice s holds global columns [bounds[s], bounds[s + 1])
  int64_t valid_vocab;
};

class CrossEntropySplitTest : public ::testing::TestWithParam<SplitCase> {};
INSTANTIATE_TEST_SUITE_P(
    Splits, CrossEntropySplitTest,
    ::testing::Values(SplitCase{{0, 5, 12}, 10},     // 2 slices, padding inside the last
                      SplitCase{{0, 4, 8, 12}, 8}),  // 3 slices, the last entirely padding
    [](const auto& info) { return std::to_string(info.param.bounds.size() - 1) + "_slices"; });

TEST_P(CrossEntropySplitTest, SlicesMatchUnsplitLossAndGradient) {
  const SplitCase& split = GetParam();
  const int64_t rows = 5, vocab = split.bounds.back(), slices = split.bounds.size() - 1;
  const int64_t valid = split.valid_vocab;
  // Targets in several slices, including the last valid column, and one ignored row.
  const std::vector<int32_t> targets = {1, static_cast<int32_t>(valid - 1), -1, 4, 6};
  const std::vector<float> logits = RandomFloats(rows * vocab, 11, -4.0f, 4.0f);
  const std::vector<float> dloss = RandomFloats(rows, 12, 0.5f, 2.0f);
  const LossResult full =
      RunCrossEntropy(MakeTensor(DType::kF32, {rows, vocab}, logits), targets, valid, dloss);

  Tensor ttargets = MakeIds({rows}, targets);
  std::vector<ops::CrossEntropyArgs> args;
  std::vector<Tensor> local_max;
  std::vector<float> global_max(rows, -std::numeric_limits<float>::infinity());
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t begin = split.bounds[s], width = split.bounds[s + 1] - begin;
    std::vector<float> block;
    for (int64_t r = 0; r < rows; ++r) {
      block.insert(block.end(), logits.begin() + r * vocab + begin,
                   logits.begin() + r * vocab + begin + width);
    }
    args.push_back({MakeTensor(DType::kF32, {rows, width}, block), ttargets, begin, valid});
    local_max.push_back(MakeZeros(DType::kF32, {rows}));
    NF_ASSERT_OK(ops::CrossEntropyRowMax(args.back(), local_max.back()));
    for (int64_t r = 0; r < rows; ++r) {
      global_max[r] = std::max(global_max[r], local_max.back().data<float>()[r]);
    }
  }
  const Tensor gmax = MakeTensor(DType::kF32, {rows}, global_max);

  // (a) As documented: every slice sums against the global max; all-reduce sums in fp32.
  std::vector<float> sum_a(rows, 0.0f), target_a(rows, 0.0f);
  // (b) Each slice against its own max, re-based: sum_s exp(max_s - max) (double, then fp32).
  std::vector<double> sum_b(rows, 0.0);
  std::vector<float> target_b(rows, 0.0f);
  for (int64_t s = 0; s < slices; ++s) {
    Tensor sum = MakeZeros(DType::kF32, {rows}), target = MakeZeros(DType::kF32, {rows});
    NF_ASSERT_OK(ops::CrossEntropySumExp(args[s], gmax, sum, target));
    Tensor lsum = MakeZeros(DType::kF32, {rows}), ltarget = MakeZeros(DType::kF32, {rows});
    NF_ASSERT_OK(ops::CrossEntropySumExp(args[s], local_max[s], lsum, ltarget));
    for (int64_t r = 0; r < rows; ++r) {
      sum_a[r] += sum.data<float>()[r];
      target_a[r] += target.data<float>()[r];
      const float m = local_max[s].data<float>()[r];
      if (m != -std::numeric_limits<float>::infinity()) {  // a slice with no valid column adds 0
        sum_b[r] += lsum.data<float>()[r] * std::exp(static_cast<double>(m) - global_max[r]);
      } else {
        EXPECT_EQ(lsum.data<float>()[r], 0.0f);
      }
      target_b[r] += ltarget.data<float>()[r];
    }
  }
  // The target logit comes from exactly one slice (0 elsewhere): exact either way.
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(target_a[r], targets[r] < 0 ? 0.0f : logits[r * vocab + targets[r]]) << r;
    EXPECT_EQ(target_b[r], target_a[r]) << r;
  }

  const std::vector<float> sum_b_f(sum_b.begin(), sum_b.end());
  for (const auto& [name, sums] :
       {std::pair<std::string, std::vector<float>>{"global max", sum_a}, {"re-based", sum_b_f}}) {
    SCOPED_TRACE(name);
    Tensor gsum = MakeTensor(DType::kF32, {rows}, sums);
    Tensor loss = MakeZeros(DType::kF32, {rows});
    NF_ASSERT_OK(ops::CrossEntropyLoss(ttargets, gmax, gsum,
                                       MakeTensor(DType::kF32, {rows}, target_a), loss));
    // The split sum_exp has one fp32 rounding per slice partial and per all-reduce addition
    // (re-basing: a few more), against one for the unsplit sum: within (slices + 3) u32
    // relative, i.e. absolute on log(sum_exp); re-basing also takes exp of x - max_s instead
    // of x - max, whose fp32 exps differ by up to 2 kExpRel (and u32 |x - max| <= 8 u32 for
    // these logits in [-4, 4]); both losses are then rounded to fp32 (2 u32).
    const double split_error = (slices + 3) * kU32 + 2 * kExpRel + 8 * kU32;
    ExpectAllClose(ToDoubles(loss), full.loss, split_error, 2 * kU32, "split loss");

    for (int64_t s = 0; s < slices; ++s) {
      const int64_t begin = split.bounds[s], width = split.bounds[s + 1] - begin;
      Tensor dlogits = MakeZeros(DType::kF32, {rows, width});
      NF_ASSERT_OK(ops::CrossEntropyBackward(args[s], gmax, gsum,
                                             MakeTensor(DType::kF32, {rows}, dloss), dlogits));
      std::vector<double> expected;
      for (int64_t r = 0; r < rows; ++r) {
        expected.insert(expected.end(), full.dlogits.begin() + r * vocab + begin,
                        full.dlogits.begin() + r * vocab + begin + width);
      }
      // p = exp(x - max) / sum_exp moves with sum_exp's split_error, times p <= 1 and dloss;
      // both gradients are rounded to fp32 (2 u32 relative). Padding columns and the ignored
      // row are exactly 0 on both sides.
      const double max_dloss = *std::max_element(dloss.begin(), dloss.end());
      ExpectAllClose(ToDoubles(dlogits), expected, split_error * max_dloss, 2 * kU32,
                     "slice dlogits");
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < width; ++c) {
          if (begin + c >= valid || targets[r] < 0) {
            EXPECT_EQ(dlogits.data<float>()[r * width + c], 0.0f) << r << ", " << begin + c;
          }
        }
      }
    }
  }
}

// A target outside [0, valid_vocab) other than -1 is a data error (a corrupt or mis-tokenised
// batch), reported with the target and its row rather than trained on silently.
TEST(CrossEntropyTest, OutOfVocabularyTargetIsAnErrorNamingIt) {
  const int64_t rows = 3, vocab = 8;
  Tensor logits = MakeTensor(DType::kF32, {rows, vocab}, RandomFloats(rows * vocab, 21));
  Tensor row_max = MakeZeros(DType::kF32, {rows}), sum_exp = MakeZeros(DType::kF32, {rows});
  Tensor loss = MakeZeros(DType::kF32, {rows});
  // Padding column 7 (valid_vocab 7) cannot be a target; neither can 8 nor -2.
  ExpectInvalidArgument(
      ops::CrossEntropyForward({logits, MakeIds({rows}, {0, 7, 1}), 0, 7}, row_max, sum_exp, loss),
      "target 7 of row 1");
  ExpectInvalidArgument(
      ops::CrossEntropyForward({logits, MakeIds({rows}, {8, 0, 1})}, row_max, sum_exp, loss),
      "target 8 of row 0");
  ExpectInvalidArgument(
      ops::CrossEntropyForward({logits, MakeIds({rows}, {0, 1, -2})}, row_max, sum_exp, loss),
      "target -2 of row 2");
  // A vocab slice accepts targets held by other slices when valid_vocab is the global size.
  NF_EXPECT_OK(
      ops::CrossEntropyForward({MakeTensor(DType::kF32, {rows, 4}, RandomFloats(rows * 4, 22)),
                                MakeIds({rows}, {6, 0, -1}), 0, 7},
                               row_max, sum_exp, loss));
}

// The step's loss accumulates over micro-batches on the device: ignored rows add nothing, and
// the sum is the row-order double sum of the fp32 losses (exact for these dyadic values).
TEST(AccumulateLossTest, AddsTheLossAndCountOfRowsWithATarget) {
  Tensor totals = MakeZeros(DType::kF64, {2});
  const Tensor loss = MakeTensor(DType::kF32, {4}, {0.5f, 2.25f, 7.0f, 1.125f});
  NF_ASSERT_OK(ops::AccumulateLoss(loss, MakeIds({4}, {3, -1, 0, 2}), totals));
  EXPECT_EQ(totals.data<double>()[0], 0.5 + 7.0 + 1.125);
  EXPECT_EQ(totals.data<double>()[1], 3.0);
  NF_ASSERT_OK(ops::AccumulateLoss(loss, MakeIds({4}, {-1, 1, -1, -1}), totals));
  EXPECT_EQ(totals.data<double>()[0], 0.5 + 7.0 + 1.125 + 2.25);
  EXPECT_EQ(totals.data<double>()[1], 4.0);
  ExpectInvalidArgument(
      ops::AccumulateLoss(loss, MakeIds({4}, {0, 0, 0, 0}), MakeZeros(DType::kF32, {2})), "totals");
  ExpectInvalidArgument(ops::AccumulateLoss(loss, MakeIds({3}, {0, 0, 0}), totals), "targets");
}

TEST(CrossEntropyTest, RejectsInconsistentArguments) {
  const int64_t rows = 3, vocab = 5;
  const auto f32 = [](Shape s) { return MakeZeros(DType::kF32, s); };
  const ops::CrossEntropyArgs good{f32({rows, vocab}), MakeIds({rows}, {0, 1, -1})};
  Tensor row_max = f32({rows}), sum_exp = f32({rows}), loss = f32({rows});
  NF_ASSERT_OK(ops::CrossEntropyForward(good, row_max, sum_exp, loss));
  ops::CrossEntropyArgs a = good;
  a.logits = f32({1, rows, vocab});
  ExpectInvalidArgument(ops::CrossEntropyRowMax(a, row_max), "logits");
  a = good;
  a.targets = MakeZeros(DType::kI64, {rows});
  ExpectInvalidArgument(ops::CrossEntropyRowMax(a, row_max), "targets");
  a = good;
  a.targets = MakeIds({rows + 1}, {0, 0, 0, 0});
  ExpectInvalidArgument(ops::CrossEntropyRowMax(a, row_max), "targets");
  a = good;
  a.valid_vocab = -1;
  ExpectInvalidArgument(ops::CrossEntropyRowMax(a, row_max), "valid_vocab");
  ExpectInvalidArgument(ops::CrossEntropyRowMax(good, f32({rows + 1})), "row_max");
  ExpectInvalidArgument(
      ops::CrossEntropySumExp(good, row_max, MakeZeros(DType::kF16, {rows}), loss), "sum_exp");
  ExpectInvalidArgument(ops::CrossEntropyLoss(good.targets, row_max, sum_exp, f32({2}), loss),
                        "target_logit");
  ExpectInvalidArgument(ops::CrossEntropyBackward(good, row_max, sum_exp, f32({rows}),
                                                  MakeZeros(DType::kBF16, {rows, vocab})),
                        "dlogits");
  ExpectInvalidArgument(
      ops::CrossEntropyBackward(good, row_max, sum_exp, f32({rows + 1}), f32({rows, vocab})),
      "dloss");
}

}  // namespace
}  // namespace nf
