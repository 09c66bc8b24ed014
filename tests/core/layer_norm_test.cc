// LayerNorm (local and tensor-parallel) against a float64 reference written here, and its
// backward against central finite differences of that reference.
//
// Error model used for every tolerance below. The CPU kernel reads the inputs exactly (the test
// rounds them to the input dtype first and gives the reference the same rounded values), sums
// the forward's statistics in double, keeps mean and rstd in fp32 (the op's contract) and forms
// xhat, y and dx with a handful of fp32 operations, each of relative error at most u32 = 2^-24.
// The backward's row sums are double for fp16 / bf16 (exact to ~1e-16); for fp32 x and weight
// they are fp32 sums over 32 fixed lanes (core/cpu/isa/norm_kernels.h), L = ceil(cols / 32) + 5
// roundings per term, so mean(g) and mean(g xhat) are within (L + 4) u32 of their terms'
// magnitudes, and the parameter gradients are summed in fp32 over blocks of up to 64 rows
// (core/cpu/layer_norm_blocks.h). A result stored in fp16 / bf16 adds one rounding of relative
// error u = 2^-11 / 2^-8 (half an ulp).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/ops/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf {
namespace {

using ::nf::testing::ExpectAllClose;
using ::nf::testing::ExpectInvalidArgument;
using ::nf::testing::kU32;
using ::nf::testing::MakeTensor;
using ::nf::testing::MakeZeros;
using ::nf::testing::MaxAbs;
using ::nf::testing::NumericGradient;
using ::nf::testing::RandomFloats;
using ::nf::testing::Rounded;
using ::nf::testing::ToDoubles;
using ::nf::testing::UnitRoundoff;

constexpr float kEps = 1e-5f;

struct RefForward {
  std::vector<double> y, mean, rstd, xhat;
};

// Two-pass float64 LayerNorm, eps as the kernel sees it (the fp32 eps widened to double).
RefForward ReferenceLayerNorm(const std::vector<double>& x, const std::vector<double>& w,
                              const std::vector<double>& b, int64_t rows, int64_t cols) {
  RefForward ref;
  ref.y.resize(x.size());
  ref.xhat.resize(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) sum += x[r * cols + c];
    const double mean = sum / cols;
    double squares = 0.0;
    for (int64_t c = 0; c < cols; ++c)
      squares += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
    const double rstd = 1.0 / std::sqrt(squares / cols + static_cast<double>(kEps));
    ref.mean.push_back(mean);
    ref.rstd.push_back(rstd);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      ref.xhat[i] = (x[i] - mean) * rstd;
      ref.y[i] = ref.xhat[i] * w[c] + b[c];
    }
  }
  return ref;
}

// sum(y * R) of the reference forward: the scalar whose gradients the backward computes.
double ReferenceLoss(const std::vector<double>& x, const std::vector<double>& w,
                     const std::vector<double>& b, const std::vector<double>& dy, int64_t rows,
                     int64_t cols) {
  const RefForward ref = ReferenceLayerNorm(x, w, b, rows, cols);
  double loss = 0.0;
  for (size_t i = 0; i < dy.size(); ++i) loss += ref.y[i] * dy[i];
  return loss;
}

// Columns [begin, begin + width) of a row-major [rows, cols] matrix.
std::vector<float> ColumnBlock(const std::vector<float>& m, int64_t rows, int64_t cols,
                               int64_t begin, int64_t width) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = begin; c < begin + width; ++c) out.push_back(m[r * cols + c]);
  }
  return out;
}
std::vector<double> ColumnBlock(const std::vector<double>& m, int64_t rows, int64_t cols,
                                int64_t begin, int64_t width) {
  std::vector<double> out;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = begin; c < begin + width; ++c) out.push_back(m[r * cols + c]);
  }
  return out;
}
std::vector<double> Slice(const std::vector<double>& v, int64_t begin, int64_t width) {
  return std::vector<double>(v.begin() + begin, v.begin() + begin + width);
}

// Inputs of one test case, already rounded to their dtypes (so kernel and reference agree).
struct Case {
  DType dtype, wdtype;
  int64_t rows, cols;
  std::vector<float> x, w, b, dy;
  std::vector<double> xd, wd, bd, dyd;  // the same values as doubles

  Case(DType dt, DType wdt, int64_t r, int64_t c, uint32_t seed, float x_offset = 0.0f)
      : dtype(dt), wdtype(wdt), rows(r), cols(c) {
    x = RandomFloats(r * c, seed, -2.0f + x_offset, 2.0f + x_offset);
    w = RandomFloats(c, seed + 1, 0.5f, 1.5f);
    b = RandomFloats(c, seed + 2, -0.5f, 0.5f);
    dy = RandomFloats(r * c, seed + 3);
    // Round once, so the floats below are exactly what the dtype holds.
    xd = Rounded(dt, x);
    wd = Rounded(wdt, w);
    bd = Rounded(wdt, b);
    dyd = Rounded(dt, dy);
    x.assign(xd.begin(), xd.end());
    w.assign(wd.begin(), wd.end());
    b.assign(bd.begin(), bd.end());
    dy.assign(dyd.begin(), dyd.end());
  }
};

struct DTypes {
  DType x, weight;
};

// L of the error model: the roundings of a backward row sum, 0 where the sums are double.
double SumRoundings(const Case& c) {
  const bool fp32_kernels = c.dtype == DType::kF32 && c.wdtype == DType::kF32;
  return fp32_kernels ? static_cast<double>((c.cols + 31) / 32 + 5) : 0.0;
}

std::string Name(const ::testing::TestParamInfo<DTypes>& info) {
  return std::string(DTypeName(info.param.x)) + "_w" + std::string(DTypeName(info.param.weight));
}

class LayerNormDTypeTest : public ::testing::TestWithParam<DTypes> {};

INSTANTIATE_TEST_SUITE_P(
    AllDTypes, LayerNormDTypeTest,
    ::testing::Values(DTypes{DType::kF32, DType::kF32}, DTypes{DType::kF16, DType::kF32},
                      DTypes{DType::kF16, DType::kF16}, DTypes{DType::kBF16, DType::kF32},
                      DTypes{DType::kBF16, DType::kBF16}, DTypes{DType::kF32, DType::kF16}),
    Name);

TEST_P(LayerNormDTypeTest, ForwardMatchesFloat64Reference) {
  // x is 3-D: every dimension but the last is a row.
  const Case c(GetParam().x, GetParam().weight, 6, 37, 11, 0.7f);
  Tensor x = MakeTensor(c.dtype, {2, 3, c.cols}, c.x);
  Tensor w = MakeTensor(c.wdtype, {c.cols}, c.w);
  Tensor b = MakeTensor(c.wdtype, {c.cols}, c.b);
  Tensor y = MakeZeros(c.dtype, {2, 3, c.cols});
  Tensor mean = MakeZeros(DType::kF32, {c.rows});
  Tensor rstd = MakeZeros(DType::kF32, {c.rows});
  NF_ASSERT_OK(ops::LayerNormForward({x, w, b, y, mean, rstd, kEps}));

  const RefForward ref = ReferenceLayerNorm(c.xd, c.wd, c.bd, c.rows, c.cols);
  // mean and rstd come from double sums rounded once to fp32: within u32 relative; 2 * u32
  // leaves room for the double sums' own ~1e-16 error.
  ExpectAllClose(ToDoubles(mean), ref.mean, 1e-12, 2 * kU32, "mean");
  ExpectAllClose(ToDoubles(rstd), ref.rstd, 0.0, 2 * kU32, "rstd");
  // y: the fp32 mean's rounding (|mean| u32, times rstd * |w|) plus ~4 fp32 operations on
  // values of size |y| + |b|, all under 8 u32 * scale; then one rounding to the output dtype.
  const double scale =
      MaxAbs(ref.mean) * MaxAbs(ref.rstd) * MaxAbs(c.wd) + MaxAbs(ref.y) + MaxAbs(c.bd);
  ExpectAllClose(ToDoubles(y), ref.y, 8 * kU32 * scale, UnitRoundoff(c.dtype), "y");
}

TEST_P(LayerNormDTypeTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const Case c(GetParam().x, GetParam().weight, 5, 19, 21, -0.3f);
  Tensor x = MakeTensor(c.dtype, {c.rows, c.cols}, c.x);
  Tensor w = MakeTensor(c.wdtype, {c.cols}, c.w);
  Tensor b = MakeTensor(c.wdtype, {c.cols}, c.b);
  Tensor y = MakeZeros(c.dtype, {c.rows, c.cols});
  Tensor mean = MakeZeros(DType::kF32, {c.rows});
  Tensor rstd = MakeZeros(DType::kF32, {c.rows});
  NF_ASSERT_OK(ops::LayerNormForward({x, w, b, y, mean, rstd, kEps}));

  Tensor dy = MakeTensor(c.dtype, {c.rows, c.cols}, c.dy);
  Tensor dx = MakeZeros(c.dtype, {c.rows, c.cols});
  // Non-zero starting gradients: the op must add to them.
  const std::vector<float> dw0 = RandomFloats(c.cols, 5), db0 = RandomFloats(c.cols, 6);
  Tensor dweight = MakeTensor(DType::kF32, {c.cols}, dw0);
  Tensor dbias = MakeTensor(DType::kF32, {c.cols}, db0);
  NF_ASSERT_OK(ops::LayerNormBackward({dy, x, w, mean, rstd, dx, dweight, dbias}));

  const int64_t rows = c.rows, cols = c.cols;
  const auto loss_of_x = [&](const std::vector<double>& v) {
    return ReferenceLoss(v, c.wd, c.bd, c.dyd, rows, cols);
  };
  const auto loss_of_w = [&](const std::vector<double>& v) {
    return ReferenceLoss(c.xd, v, c.bd, c.dyd, rows, cols);
  };
  const auto loss_of_b = [&](const std::vector<double>& v) {
    return ReferenceLoss(c.xd, c.wd, v, c.dyd, rows, cols);
  };
  // Central differences in double with h = 1e-5: truncation h^2/6 |f'''| and cancellation
  // 1e-16 |f| / h are both below 1e-9 for these O(1)-sized functions.
  const std::vector<double> gx = NumericGradient(loss_of_x, c.xd, 1e-5);
  std::vector<double> gw = NumericGradient(loss_of_w, c.wd, 1e-5);
  std::vector<double> gb = NumericGradient(loss_of_b, c.bd, 1e-5);

  const RefForward ref = ReferenceLayerNorm(c.xd, c.wd, c.bd, rows, cols);
  const double max_g = MaxAbs(c.dyd) * MaxAbs(c.wd), max_xhat = MaxAbs(ref.xhat);
  // dx = rstd (g - mean(g) - xhat mean(g xhat)): each term is bounded by rstd * max|g| *
  // (1, 1, max|xhat|^2) and carries a few fp32 roundings (xhat, rstd, the final product):
  // 16 u32 times that scale, plus the fp32 row sums' (L + 4) u32 of it, plus 1e-8 for the
  // finite differences, plus the output rounding.
  const double dx_atol =
      (16 + SumRoundings(c) + 4) * kU32 * MaxAbs(ref.rstd) * max_g * (2 + max_xhat * max_xhat) +
      1e-8;
  ExpectAllClose(ToDoubles(dx), gx, dx_atol, UnitRoundoff(c.dtype), "dx");

  for (int64_t i = 0; i < cols; ++i) {
    gw[i] += dw0[i];
    gb[i] += db0[i];
  }
  // dweight = dw0 + sum_r dy xhat: each of the `rows` terms has ~3 u32 error from the fp32
  // xhat; the block's sum over its rows (fp32 with the fp32 kernels: (rows - 1) u32 of the
  // terms' magnitudes; double otherwise) and then dw0 + sum are rounded to fp32, each within
  // u32 of magnitudes up to |dw0| + rows max|dy xhat|, |dw0| <= 1 (the result may be smaller
  // after cancellation).
  const double block_sum = SumRoundings(c) > 0 ? static_cast<double>(rows - 1) : 0.0;
  const double dw_atol = (4 + block_sum) * kU32 * rows * MaxAbs(c.dyd) * max_xhat +
                         2 * kU32 * (1 + rows * MaxAbs(c.dyd) * max_xhat) + 1e-8;
  ExpectAllClose(ToDoubles(dweight), gw, dw_atol, 0.0, "dweight");
  // dbias = db0 + sum_r dy: a sum of exact inputs (exact in double; (rows - 1) u32 in fp32),
  // then the same two fp32 roundings.
  const double db_atol =
      block_sum * kU32 * rows * MaxAbs(c.dyd) + 2 * kU32 * (1 + rows * MaxAbs(c.dyd)) + 1e-8;
  ExpectAllClose(ToDoubles(dbias), gb, db_atol, 0.0, "dbias");
}

// The tensor-parallel forward: per-shard stats, summed as the all-reduce would (in fp32), then
// each shard normalises its columns with the global statistics.
TEST_P(LayerNormDTypeTest, ShardedForwardMatchesUnsharded) {
  const Case c(GetParam().x, GetParam().weight, 7, 23, 31, 0.5f);
  Tensor x = MakeTensor(c.dtype, {c.rows, c.cols}, c.x);
  Tensor w = MakeTensor(c.wdtype, {c.cols}, c.w);
  Tensor b = MakeTensor(c.wdtype, {c.cols}, c.b);
  Tensor y = MakeZeros(c.dtype, {c.rows, c.cols});
  Tensor mean = MakeZeros(DType::kF32, {c.rows});
  Tensor rstd = MakeZeros(DType::kF32, {c.rows});
  NF_ASSERT_OK(ops::LayerNormForward({x, w, b, y, mean, rstd, kEps}));
  const std::vector<double> y_full = ToDoubles(y);
  const RefForward ref = ReferenceLayerNorm(c.xd, c.wd, c.bd, c.rows, c.cols);

  for (const std::vector<int64_t>& widths :
       {std::vector<int64_t>{11, 12}, std::vector<int64_t>{7, 9, 7}}) {
    const int64_t shards = widths.size();
    SCOPED_TRACE(::testing::Message() << shards << " shards");
    std::vector<Tensor> xs, ws, bs;
    std::vector<double> stats(c.rows * 2, 0.0);
    int64_t begin = 0;
    for (int64_t width : widths) {
      xs.push_back(
          MakeTensor(c.dtype, {c.rows, width}, ColumnBlock(c.x, c.rows, c.cols, begin, width)));
      ws.push_back(*w.View(begin, {width}));
      bs.push_back(*b.View(begin, {width}));
      Tensor partial = MakeZeros(DType::kF64, {c.rows, 2});
      NF_ASSERT_OK(ops::LayerNormPartialStats(xs.back(), partial));
      for (int64_t i = 0; i < c.rows * 2; ++i) stats[i] += partial.data<double>()[i];
      begin += width;
    }
    ASSERT_EQ(begin, c.cols);
    Tensor global = MakeZeros(DType::kF64, {c.rows, 2});
    std::copy(stats.begin(), stats.end(), global.data<double>());

    // Error budget of the E[x^2] - mean^2 form from fp64 sums: every partial sum and every
    // addition of the all-reduce is one double rounding, (cols + shards) u64 relative on sum x
    // and sum x^2; relative to var the x^2 error is amplified by kappa = E[x^2] / var. rstd is
    // then rounded to fp32 (u32) on both sides, so the two can differ by 2 u32 plus that.
    constexpr double kU64 = 0x1p-53;
    double kappa = 0.0, mean_shift = 0.0;
    for (int64_t r = 0; r < c.rows; ++r) {
      double sq = 0.0, abs_sum = 0.0;
      for (int64_t j = 0; j < c.cols; ++j) {
        sq += c.xd[r * c.cols + j] * c.xd[r * c.cols + j];
        abs_sum += std::abs(c.xd[r * c.cols + j]);
      }
      const double rstd_r = ref.rstd[r];
      kappa = std::max(kappa, sq / c.cols * rstd_r * rstd_r);
      mean_shift = std::max(mean_shift, abs_sum / c.cols * rstd_r);
    }
    const double rstd_rel = (c.cols + shards) * kU64 * kappa;
    // The fp32 mean of each side is correctly rounded from nearly the same double: 2 u32 of
    // mean|x|, moving xhat by that times rstd.
    const double xhat_err = 2 * kU32 * mean_shift + MaxAbs(ref.xhat) * (rstd_rel + 2 * kU32);
    // y differs by |w| xhat_err plus each side's fp32 work (8 u32 of |y|); the two fp32 values
    // then round independently to the output dtype, which can split them by one ulp (2u).
    const double y_atol = MaxAbs(c.wd) * xhat_err + 8 * kU32 * (MaxAbs(ref.y) + 1);
    begin = 0;
    for (int64_t s = 0; s < shards; ++s) {
      const int64_t width = widths[s];
      Tensor ys = MakeZeros(c.dtype, {c.rows, width});
      Tensor means = MakeZeros(DType::kF32, {c.rows});
      Tensor rstds = MakeZeros(DType::kF32, {c.rows});
      NF_ASSERT_OK(ops::LayerNormForwardFromStats({xs[s], ws[s], bs[s], ys, means, rstds, kEps},
                                                  global, c.cols));
      ExpectAllClose(ToDoubles(ys), ColumnBlock(y_full, c.rows, c.cols, begin, width), y_atol,
                     2 * UnitRoundoff(c.dtype), "shard y");
      // mean: both sides round nearly the same double to fp32, one ulp apart at most.
      ExpectAllClose(ToDoubles(means), ToDoubles(mean), 0.0, 2 * kU32, "shard mean");
      ExpectAllClose(ToDoubles(rstds), ToDoubles(rstd), 0.0, rstd_rel + 2 * kU32, "shard rstd");
      begin += width;
    }
  }
}

// The tensor-parallel backward: per-shard (sum g, sum g xhat), summed, then each shard's dx from
// the global sums; dweight and dbias are per column, so they match the unsharded ones exactly.
TEST_P(LayerNormDTypeTest, ShardedBackwardMatchesUnsharded) {
  const Case c(GetParam().x, GetParam().weight, 6, 17, 41, 0.2f);
  Tensor x = MakeTensor(c.dtype, {c.rows, c.cols}, c.x);
  Tensor w = MakeTensor(c.wdtype, {c.cols}, c.w);
  Tensor b = MakeTensor(c.wdtype, {c.cols}, c.b);
  Tensor y = MakeZeros(c.dtype, {c.rows, c.cols});
  // Both backward paths use the unsharded forward's mean and rstd, so this test isolates the
  // backward's split (the forward's is checked above).
  Tensor mean = MakeZeros(DType::kF32, {c.rows});
  Tensor rstd = MakeZeros(DType::kF32, {c.rows});
  NF_ASSERT_OK(ops::LayerNormForward({x, w, b, y, mean, rstd, kEps}));
  Tensor dy = MakeTensor(c.dtype, {c.rows, c.cols}, c.dy);
  Tensor dx = MakeZeros(c.dtype, {c.rows, c.cols});
  const std::vector<float> dw0 = RandomFloats(c.cols, 7), db0 = RandomFloats(c.cols, 8);
  Tensor dweight = MakeTensor(DType::kF32, {c.cols}, dw0);
  Tensor dbias = MakeTensor(DType::kF32, {c.cols}, db0);
  NF_ASSERT_OK(ops::LayerNormBackward({dy, x, w, mean, rstd, dx, dweight, dbias}));
  const std::vector<double> dx_full = ToDoubles(dx), dw_full = ToDoubles(dweight),
                            db_full = ToDoubles(dbias);
  const RefForward ref = ReferenceLayerNorm(c.xd, c.wd, c.bd, c.rows, c.cols);

  for (const std::vector<int64_t>& widths :
       {std::vector<int64_t>{9, 8}, std::vector<int64_t>{5, 6, 6}}) {
    const int64_t shards = widths.size();
    SCOPED_TRACE(::testing::Message() << shards << " shards");
    std::vector<ops::LayerNormBackwardArgs> args;
    std::vector<float> sums(c.rows * 2, 0.0f);
    int64_t begin = 0;
    for (int64_t width : widths) {
      ops::LayerNormBackwardArgs a;
      a.dy = MakeTensor(c.dtype, {c.rows, width}, ColumnBlock(c.dy, c.rows, c.cols, begin, width));
      a.x = MakeTensor(c.dtype, {c.rows, width}, ColumnBlock(c.x, c.rows, c.cols, begin, width));
      a.weight = *w.View(begin, {width});
      a.mean = mean;
      a.rstd = rstd;
      a.dx = MakeZeros(c.dtype, {c.rows, width});
      a.dweight = MakeTensor(DType::kF32, {width},
                             std::vector<float>(dw0.begin() + begin, dw0.begin() + begin + width));
      a.dbias = MakeTensor(DType::kF32, {width},
                           std::vector<float>(db0.begin() + begin, db0.begin() + begin + width));
      Tensor partial = MakeZeros(DType::kF32, {c.rows, 2});
      NF_ASSERT_OK(ops::LayerNormBackwardPartialSums(a, partial));
      for (int64_t i = 0; i < c.rows * 2; ++i) sums[i] += partial.data<float>()[i];
      args.push_back(a);
      begin += width;
    }
    const Tensor global = MakeTensor(DType::kF32, {c.rows, 2}, sums);

    // The unsharded path divides double sums; the sharded one fp32 sums with (shards + 2)
    // roundings, i.e. (shards + 2) u32 * max|g| (sum g) and * max|g| max|xhat| (sum g xhat) per
    // column mean. dx = rstd (g - mean_g - xhat mean_gxhat) moves by rstd times those errors,
    // plus 8 u32 of each side's own fp32 work; the two then round independently (2u).
    const double max_g = MaxAbs(c.dyd) * MaxAbs(c.wd), max_xhat = MaxAbs(ref.xhat);
    const double dx_atol =
        MaxAbs(ref.rstd) * max_g * (1 + max_xhat * max_xhat) * ((shards + 2) * kU32 + 8 * kU32);
    begin = 0;
    for (int64_t s = 0; s < shards; ++s) {
      const int64_t width = widths[s];
      NF_ASSERT_OK(ops::LayerNormBackwardFromSums(args[s], global, c.cols));
      ExpectAllClose(ToDoubles(args[s].dx), ColumnBlock(dx_full, c.rows, c.cols, begin, width),
                     dx_atol, 2 * UnitRoundoff(c.dtype), "shard dx");
      // Same per-column loop over the same values in the same order: bit-identical.
      ExpectAllClose(ToDoubles(args[s].dweight), Slice(dw_full, begin, width), 0.0, 0.0,
                     "shard dweight");
      ExpectAllClose(ToDoubles(args[s].dbias), Slice(db_full, begin, width), 0.0, 0.0,
                     "shard dbias");
      begin += width;
    }
  }
}

// Rows whose mean dwarfs their spread: E[x^2] - mean^2 in fp32 would lose every significant
// bit of the variance (x^2 ~ 1e8 has an fp32 ulp of 8, the variance is ~1/3).
TEST(LayerNormTest, LargeMeanRowsKeepTheirVariance) {
  const int64_t rows = 4, cols = 64;
  std::vector<float> x = RandomFloats(rows * cols, 3);
  for (int64_t i = 0; i < rows * cols; ++i) x[i] += (i / cols) % 2 == 0 ? 1e4f : -3e4f;
  const std::vector<float> w = RandomFloats(cols, 4, 0.5f, 1.5f), b = RandomFloats(cols, 5);
  Tensor tx = MakeTensor(DType::kF32, {rows, cols}, x);
  Tensor y = MakeZeros(DType::kF32, {rows, cols});
  Tensor mean = MakeZeros(DType::kF32, {rows});
  Tensor rstd = MakeZeros(DType::kF32, {rows});
  NF_ASSERT_OK(ops::LayerNormForward({tx, MakeTensor(DType::kF32, {cols}, w),
                                      MakeTensor(DType::kF32, {cols}, b), y, mean, rstd, kEps}));
  const std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(b.begin(), b.end());
  const RefForward ref = ReferenceLayerNorm(xd, wd, bd, rows, cols);
  // Double two-pass statistics rounded once to fp32 (see ForwardMatchesFloat64Reference).
  ExpectAllClose(ToDoubles(mean), ref.mean, 0.0, 2 * kU32, "mean");
  ExpectAllClose(ToDoubles(rstd), ref.rstd, 0.0, 2 * kU32, "rstd");
  // The contract stores mean in fp32: its rounding error, up to 3e4 u32 = 1.8e-3, shifts every
  // x - mean, i.e. y by 1.8e-3 rstd |w| (rstd ~ 1.7). 2 * that, plus 8 u32 of |y|, bounds y;
  // still far below the O(1) error of a variance computed in fp32 from E[x^2].
  const double atol = 2 * 3e4 * kU32 * MaxAbs(ref.rstd) * MaxAbs(wd) + 8 * kU32 * MaxAbs(ref.y);
  ExpectAllClose(ToDoubles(y), ref.y, atol, 0.0, "y");
}

// The tensor-parallel path on the same rows: f64 statistics keep E[x^2] - mean^2 exact enough
// that two shards reproduce the unsharded output. (With fp32 sums, var would carry an absolute
// error of about u32 * 9e8 = 54 against a true var of 1/3: the output would be garbage.)
TEST(LayerNormTest, ShardedLargeMeanRowsKeepTheirVariance) {
  const int64_t rows = 4, cols = 64, half = cols / 2;
  std::vector<float> x = RandomFloats(rows * cols, 3);
  for (int64_t i = 0; i < rows * cols; ++i) x[i] += (i / cols) % 2 == 0 ? 1e4f : -3e4f;
  const std::vector<float> w = RandomFloats(cols, 4, 0.5f, 1.5f), b = RandomFloats(cols, 5);
  Tensor tw = MakeTensor(DType::kF32, {cols}, w), tb = MakeTensor(DType::kF32, {cols}, b);
  Tensor y = MakeZeros(DType::kF32, {rows, cols});
  Tensor mean = MakeZeros(DType::kF32, {rows}), rstd = MakeZeros(DType::kF32, {rows});
  NF_ASSERT_OK(ops::LayerNormForward(
      {MakeTensor(DType::kF32, {rows, cols}, x), tw, tb, y, mean, rstd, kEps}));

  std::vector<Tensor> shards;
  Tensor stats = MakeZeros(DType::kF64, {rows, 2});
  for (int64_t s = 0; s < 2; ++s) {
    shards.push_back(
        MakeTensor(DType::kF32, {rows, half}, ColumnBlock(x, rows, cols, s * half, half)));
    Tensor partial = MakeZeros(DType::kF64, {rows, 2});
    NF_ASSERT_OK(ops::LayerNormPartialStats(shards.back(), partial));
    for (int64_t i = 0; i < rows * 2; ++i) stats.data<double>()[i] += partial.data<double>()[i];
  }
  const std::vector<double> y_full = ToDoubles(y);
  for (int64_t s = 0; s < 2; ++s) {
    Tensor ys = MakeZeros(DType::kF32, {rows, half});
    Tensor means = MakeZeros(DType::kF32, {rows}), rstds = MakeZeros(DType::kF32, {rows});
    NF_ASSERT_OK(ops::LayerNormForwardFromStats(
        {shards[s], *tw.View(s * half, {half}), *tb.View(s * half, {half}), ys, means, rstds, kEps},
        stats, cols));
    // rstd from E[x^2] - mean^2 in double: sum x^2 ~ 64 * 9e8 carries ~64 u64 relative, i.e.
    // an absolute var error ~ 6e10 * 2^-53 ~ 7e-6 against var ~ 1/3: 2e-5 relative on var,
    // 1e-5 on rstd. The two fp32 means may differ by one ulp of 3e4 (2^-9), which moves
    // xhat by 2^-9 rstd (rstd ~ 1.7). Bound y by |w| (2^-9 rstd + 1e-5 |xhat|) plus 8 u32 |y|.
    const std::vector<double> expected = ColumnBlock(y_full, rows, cols, s * half, half);
    ExpectAllClose(ToDoubles(ys), expected, 1.5 * (0x1p-9 * 1.8 + 1e-5 * 2.0) + 8 * kU32 * 4.0, 0.0,
                   "sharded large-mean y");
    ExpectAllClose(ToDoubles(rstds), ToDoubles(rstd), 0.0, 1e-5 + 2 * kU32, "sharded rstd");
  }
}

// Enough rows that the kernels split them into several thread-pool chunks (each chunk is at
// least ~32k flops, i.e. 85 rows of 64 columns here). thread_pool.h promises results that do
// not depend on the split, so the one big call must reproduce, bit for bit, calls on row blocks
// small enough to run as a single chunk each.
TEST(LayerNormTest, ChunkedRowsMatchSmallBlocks) {
  const Case c(DType::kF32, DType::kF32, 256, 64, 51, 0.1f);
  const int64_t block = 16;
  Tensor w = MakeTensor(c.wdtype, {c.cols}, c.w);
  Tensor b = MakeTensor(c.wdtype, {c.cols}, c.b);
  struct Outputs {
    std::vector<double> y, mean, rstd, dx, dweight, dbias;
  };
  const auto append = [](std::vector<double>& to, const Tensor& t) {
    const std::vector<double> v = ToDoubles(t);
    to.insert(to.end(), v.begin(), v.end());
  };
  // Forward and backward of rows [first, first + rows), appended to `out`.
  const auto run = [&](int64_t first, int64_t rows, Outputs& out) {
    const auto part = [&](const std::vector<float>& m) {
      return std::vector<float>(m.begin() + first * c.cols, m.begin() + (first + rows) * c.cols);
    };
    Tensor x = MakeTensor(c.dtype, {rows, c.cols}, part(c.x));
    Tensor y = MakeZeros(c.dtype, {rows, c.cols});
    Tensor mean = MakeZeros(DType::kF32, {rows});
    Tensor rstd = MakeZeros(DType::kF32, {rows});
    NF_ASSERT_OK(ops::LayerNormForward({x, w, b, y, mean, rstd, kEps}));
    Tensor dy = MakeTensor(c.dtype, {rows, c.cols}, part(c.dy));
    Tensor dx = MakeZeros(c.dtype, {rows, c.cols});
    Tensor dw = MakeZeros(DType::kF32, {c.cols}), db = MakeZeros(DType::kF32, {c.cols});
    NF_ASSERT_OK(ops::LayerNormBackward({dy, x, w, mean, rstd, dx, dw, db}));
    append(out.y, y);
    append(out.mean, mean);
    append(out.rstd, rstd);
    append(out.dx, dx);
    out.dweight = ToDoubles(dw);
    out.dbias = ToDoubles(db);
  };
  Outputs all, blocks;
  run(0, c.rows, all);
  for (int64_t first = 0; first < c.rows; first += block) run(first, block, blocks);
  ExpectAllClose(all.y, blocks.y, 0.0, 0.0, "y");
  ExpectAllClose(all.mean, blocks.mean, 0.0, 0.0, "mean");
  ExpectAllClose(all.rstd, blocks.rstd, 0.0, 0.0, "rstd");
  ExpectAllClose(all.dx, blocks.dx, 0.0, 0.0, "dx");

  // And the big call is right, not just self-consistent (the error models of
  // ForwardMatchesFloat64Reference and BackwardMatchesFiniteDifferencesAndAccumulates; the
  // parameter gradients here start from 0 and sum over every row).
  const RefForward ref = ReferenceLayerNorm(c.xd, c.wd, c.bd, c.rows, c.cols);
  const double scale =
      MaxAbs(ref.mean) * MaxAbs(ref.rstd) * MaxAbs(c.wd) + MaxAbs(ref.y) + MaxAbs(c.bd);
  ExpectAllClose(all.y, ref.y, 8 * kU32 * scale, 0.0, "y vs reference");
  std::vector<double> dw_ref(c.cols, 0.0), db_ref(c.cols, 0.0);
  double dw_magnitude = 0.0;  // max over columns of sum_r |dy xhat|
  for (int64_t j = 0; j < c.cols; ++j) {
    double magnitude = 0.0;
    for (int64_t r = 0; r < c.rows; ++r) {
      dw_ref[j] += c.dyd[r * c.cols + j] * ref.xhat[r * c.cols + j];
      db_ref[j] += c.dyd[r * c.cols + j];
      magnitude += std::abs(c.dyd[r * c.cols + j] * ref.xhat[r * c.cols + j]);
    }
    dw_magnitude = std::max(dw_magnitude, magnitude);
  }
  // Each term's fp32 xhat is within 3 u32 relative; each block of 64 rows sums its terms in
  // fp32 (63 u32 of their magnitudes), the blocks are added in double and the result is rounded
  // once (u32).
  const double dw_atol = (3 + 63 + 1) * kU32 * dw_magnitude;
  ExpectAllClose(all.dweight, dw_ref, dw_atol, 0.0, "dweight vs reference");
  double db_magnitude = 0.0;  // max over columns of sum_r |dy|
  for (int64_t j = 0; j < c.cols; ++j) {
    double magnitude = 0.0;
    for (int64_t r = 0; r < c.rows; ++r) magnitude += std::abs(c.dyd[r * c.cols + j]);
    db_magnitude = std::max(db_magnitude, magnitude);
  }
  ExpectAllClose(all.dbias, db_ref, (63 + 1) * kU32 * db_magnitude, 0.0, "dbias vs reference");
}

TEST(LayerNormTest, SingleColumnOutputsBias) {
  // One column: x - mean = 0, so y = bias exactly, and dx = 0, dweight += 0, dbias += dy.
  const int64_t rows = 3;
  Tensor x = MakeTensor(DType::kF32, {rows, 1}, {5.0f, -2.0f, 1e4f});
  Tensor w = MakeTensor(DType::kF32, {1}, {3.0f});
  Tensor b = MakeTensor(DType::kF32, {1}, {0.25f});
  Tensor y = MakeZeros(DType::kF32, {rows, 1});
  Tensor mean = MakeZeros(DType::kF32, {rows});
  Tensor rstd = MakeZeros(DType::kF32, {rows});
  NF_ASSERT_OK(ops::LayerNormForward({x, w, b, y, mean, rstd, kEps}));
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(y.data<float>()[r], 0.25f) << r;
    EXPECT_EQ(mean.data<float>()[r], x.data<float>()[r]) << r;
    // var = 0: rstd = 1 / sqrt(eps) rounded to fp32 (one half-ulp, 2^-24 relative).
    EXPECT_NEAR(rstd.data<float>()[r], 1.0 / std::sqrt(static_cast<double>(kEps)),
                kU32 / std::sqrt(static_cast<double>(kEps)))
        << r;
  }
  Tensor dy = MakeTensor(DType::kF32, {rows, 1}, {1.0f, 2.0f, -0.5f});
  Tensor dx = MakeTensor(DType::kF32, {rows, 1}, {9.0f, 9.0f, 9.0f});
  Tensor dweight = MakeTensor(DType::kF32, {1}, {1.0f});
  Tensor dbias = MakeTensor(DType::kF32, {1}, {1.0f});
  NF_ASSERT_OK(ops::LayerNormBackward({dy, x, w, mean, rstd, dx, dweight, dbias}));
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(dx.data<float>()[r], 0.0f) << r;
  EXPECT_EQ(dweight.data<float>()[0], 1.0f);  // + sum dy * 0
  EXPECT_EQ(dbias.data<float>()[0], 3.5f);    // 1 + (1 + 2 - 0.5), exact in fp32
}

TEST(LayerNormTest, ZeroRowsIsANoOp) {
  const int64_t cols = 8;
  Tensor x = MakeZeros(DType::kF32, {0, cols});
  Tensor w = MakeTensor(DType::kF32, {cols}, RandomFloats(cols, 1));
  Tensor b = MakeTensor(DType::kF32, {cols}, RandomFloats(cols, 2));
  Tensor y = MakeZeros(DType::kF32, {0, cols});
  Tensor mean = MakeZeros(DType::kF32, {0});
  Tensor rstd = MakeZeros(DType::kF32, {0});
  NF_EXPECT_OK(ops::LayerNormForward({x, w, b, y, mean, rstd, kEps}));
  Tensor stats = MakeZeros(DType::kF64, {0, 2});
  NF_EXPECT_OK(ops::LayerNormPartialStats(x, stats));
  NF_EXPECT_OK(ops::LayerNormForwardFromStats({x, w, b, y, mean, rstd, kEps}, stats, 16));
  const std::vector<float> dw0 = RandomFloats(cols, 3), db0 = RandomFloats(cols, 4);
  Tensor dweight = MakeTensor(DType::kF32, {cols}, dw0);
  Tensor dbias = MakeTensor(DType::kF32, {cols}, db0);
  const ops::LayerNormBackwardArgs args{x, x, w, mean, rstd, y, dweight, dbias};
  NF_EXPECT_OK(ops::LayerNormBackward(args));
  Tensor sums = MakeZeros(DType::kF32, {0, 2});
  NF_EXPECT_OK(ops::LayerNormBackwardPartialSums(args, sums));
  NF_EXPECT_OK(ops::LayerNormBackwardFromSums(args, sums, 16));
  // Nothing to add: the accumulated gradients keep their values exactly.
  ExpectAllClose(ToDoubles(dweight), std::vector<double>(dw0.begin(), dw0.end()), 0, 0, "dw");
  ExpectAllClose(ToDoubles(dbias), std::vector<double>(db0.begin(), db0.end()), 0, 0, "db");
}

TEST(LayerNormTest, RejectsInconsistentArguments) {
  const int64_t rows = 3, cols = 4;
  const auto f32 = [](Shape s) { return MakeZeros(DType::kF32, s); };
  const ops::LayerNormArgs good{f32({rows, cols}), f32({cols}), f32({cols}), f32({rows, cols}),
                                f32({rows}),       f32({rows}), kEps};
  NF_ASSERT_OK(ops::LayerNormForward(good));

  ops::LayerNormArgs a = good;
  a.weight = f32({cols + 1});
  ExpectInvalidArgument(ops::LayerNormForward(a), "weight");
  a = good;
  a.bias = f32({rows, cols});
  ExpectInvalidArgument(ops::LayerNormForward(a), "bias");
  a = good;
  a.y = MakeZeros(DType::kF16, {rows, cols});
  ExpectInvalidArgument(ops::LayerNormForward(a), "y");
  a = good;
  a.y = f32({cols, rows});
  ExpectInvalidArgument(ops::LayerNormForward(a), "y");
  a = good;
  a.mean = MakeZeros(DType::kF16, {rows});
  ExpectInvalidArgument(ops::LayerNormForward(a), "mean");
  a = good;
  a.rstd = f32({rows + 1});
  ExpectInvalidArgument(ops::LayerNormForward(a), "rstd");
  a = good;
  a.x = MakeZeros(DType::kI32, {rows, cols});
  ExpectInvalidArgument(ops::LayerNormForward(a), "x");
  a = good;
  a.eps = 0.0f;
  ExpectInvalidArgument(ops::LayerNormForward(a), "eps");
  // Weight and bias are read with one dtype: a bias of another dtype is an error, not a crash.
  a = good;
  a.bias = MakeZeros(DType::kF16, {cols});
  ExpectInvalidArgument(ops::LayerNormForward(a), "bias");

  // Tensor-parallel statistics: [rows, 2] f64, and total_cols covering the local columns.
  const Tensor f64_stats = MakeZeros(DType::kF64, {rows, 2});
  ExpectInvalidArgument(ops::LayerNormPartialStats(good.x, MakeZeros(DType::kF64, {rows})),
                        "stats");
  ExpectInvalidArgument(ops::LayerNormPartialStats(good.x, f32({rows, 2})), "stats");
  ExpectInvalidArgument(
      ops::LayerNormForwardFromStats(good, MakeZeros(DType::kF64, {rows, 3}), cols), "stats");
  ExpectInvalidArgument(ops::LayerNormForwardFromStats(good, f64_stats, cols - 1), "total_cols");
  ExpectInvalidArgument(ops::LayerNormForwardFromStats(good, f64_stats, 0), "total_cols");

  const ops::LayerNormBackwardArgs bgood{f32({rows, cols}), f32({rows, cols}), f32({cols}),
                                         f32({rows}),       f32({rows}),       f32({rows, cols}),
                                         f32({cols}),       f32({cols})};
  NF_ASSERT_OK(ops::LayerNormBackward(bgood));
  ops::LayerNormBackwardArgs bad = bgood;
  bad.dy = f32({rows, cols + 1});
  ExpectInvalidArgument(ops::LayerNormBackward(bad), "dy");
  bad = bgood;
  bad.dx = MakeZeros(DType::kBF16, {rows, cols});
  ExpectInvalidArgument(ops::LayerNormBackward(bad), "dx");
  bad = bgood;
  bad.dweight = MakeZeros(DType::kF16, {cols});  // parameter gradients are fp32
  ExpectInvalidArgument(ops::LayerNormBackward(bad), "dweight");
  bad = bgood;
  bad.dbias = f32({cols + 1});
  ExpectInvalidArgument(ops::LayerNormBackward(bad), "dbias");
  bad = bgood;
  bad.weight = f32({1});
  ExpectInvalidArgument(ops::LayerNormBackward(bad), "weight");
  ExpectInvalidArgument(ops::LayerNormBackwardPartialSums(bgood, f32({rows + 1, 2})), "sums");
  ExpectInvalidArgument(ops::LayerNormBackwardFromSums(bgood, f32({rows, 2}), cols - 1),
                        "total_cols");
}

}  // namespace
}  // namespace nf
