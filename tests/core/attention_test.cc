// Softmax and attention, causal and bidirectional (with Philox dropout), against float64
// references written here, and their backward passes against central finite differences of those
// references.
//
// Error model behind the tolerances: inputs are rounded to their dtype before the test starts
// and the reference gets the same rounded values, so the only differences are the kernels' fp32
// arithmetic (unit roundoff u32 = 2^-24 per operation, sums of n terms up to n u32 of the sum of
// magnitudes) and, for fp16 / bf16 results, one final rounding of relative error u = 2^-11 /
// 2^-8. Central differences are taken in double with h = 1e-5 on functions of size O(1-10):
// truncation (h^2 / 6 |f'''|) and cancellation (1e-16 |f| / h) stay below 1e-8, which is added
// to every gradient tolerance. fp32 score rows take the CPU's vectorised exp, within
// kExpMaxUlps ulp (kExpRel = 2 kExpMaxUlps u32 relative, core/cpu/isa/softmax_kernels.h) of the
// exponential of its fp32 argument.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cpu/isa/softmax_kernels.h"
#include "core/ops/ops.h"
#include "core/philox.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf {
namespace {

using ::nf::testing::ExpectAllClose;
using ::nf::testing::kU32;
using ::nf::testing::MakeTensor;
using ::nf::testing::MakeZeros;
using ::nf::testing::MaxAbs;
using ::nf::testing::NumericGradient;
using ::nf::testing::RandomFloats;
using ::nf::testing::Rounded;
using ::nf::testing::ToDoubles;
using ::nf::testing::UnitRoundoff;
using ::testing::HasSubstr;

// The CPU exp's relative error bound (see the error model above).
constexpr double kExpRel = 2 * cpu::kExpMaxUlps * ::nf::testing::kU32;

constexpr double kFdError = 1e-8;  // central differences in double, see the header comment
constexpr float kInf = std::numeric_limits<float>::infinity();

// Values rounded to dtype, as floats (exactly representable in dtype) and as doubles.
struct Input {
  std::vector<float> f;
  std::vector<double> d;
  Input(DType dtype, size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f)
      : d(Rounded(dtype, RandomFloats(n, seed, lo, hi))) {
    f.assign(d.begin(), d.end());
  }
};

// ---- Softmax -----------------------------------------------------------------------------------

std::vector<double> ReferenceSoftmax(const std::vector<double>& x, int64_t rows, int64_t cols) {
  std::vector<double> y(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double max = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) max = std::max(max, x[r * cols + c]);
    if (max == -INFINITY) continue;
    double sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(x[r * cols + c] - max);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = std::exp(x[r * cols + c] - max) / sum;
  }
  return y;
}

class SoftmaxDTypeTest : public ::testing::TestWithParam<DType> {};
INSTANTIATE_TEST_SUITE_P(AllDTypes, SoftmaxDTypeTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST_P(SoftmaxDTypeTest, ForwardAndBackwardMatchReference) {
  const DType dtype = GetParam();
  const double u = UnitRoundoff(dtype);
  const int64_t rows = 5, cols = 13;
  const Input x(dtype, rows * cols, 1, -4.0f, 4.0f), dy(dtype, rows * cols, 2);
  Tensor tx = MakeTensor(dtype, {rows, cols}, x.f);
  Tensor ty = MakeZeros(dtype, {rows, cols});
  NF_ASSERT_OK(ops::SoftmaxForward(tx, ty));
  const std::vector<double> y_ref = ReferenceSoftmax(x.d, rows, cols);
  // The kernel forms x - max in fp32: |x - max| < 8 here, so within half an ulp, 4 u32, of the
  // exponent. fp32 takes the vectorised exp (kExpRel more), fp16 / bf16 a double one: numerator
  // and sum (a weighted mean of its terms' errors) within 4 u32 + kExpRel relative each, then
  // 1 / sum and the product round once each: 8 u32 + 2 kExpRel (14 u32), and 20 u32 keeps a
  // margin. fp16 / bf16 add the output rounding u.
  const double y_rtol = 20 * kU32 + u;
  ExpectAllClose(ToDoubles(ty), y_ref, 0.0, y_rtol, "softmax y");

  // Backward from the kernel's own y, as in training, against d/dx sum(softmax(x) * dy).
  Tensor tdy = MakeTensor(dtype, {rows, cols}, dy.f);
  Tensor tdx = MakeZeros(dtype, {rows, cols});
  NF_ASSERT_OK(ops::SoftmaxBackward(ty, tdy, tdx));
  const auto loss = [&](const std::vector<double>& v) {
    const std::vector<double> y = ReferenceSoftmax(v, rows, cols);
    double sum = 0.0;
    for (size_t i = 0; i < y.size(); ++i) sum += y[i] * dy.d[i];
    return sum;
  };
  const std::vector<double> dx_ref = NumericGradient(loss, x.d, 1e-5);
  // dx_i = y_i (dy_i - dot), |dot| <= max|dy|: the stored y_i's relative error y_rtol, dot's
  // (<= y_rtol max|dy|) and a few fp32 operations give |y_i| (3 y_rtol + 4 u32) 2 max|dy|,
  // with |y_i| <= 1; then the output rounding u.
  const double dx_atol = 2 * MaxAbs(dy.d) * (3 * y_rtol + 4 * kU32) + kFdError;
  ExpectAllClose(ToDoubles(tdx), dx_ref, dx_atol, u, "softmax dx");
}

TEST_P(SoftmaxDTypeTest, MaskedRowsGiveZerosAndFiniteProbabilities) {
  const DType dtype = GetParam();
  const int64_t cols = 4;
  // Fully masked, partly masked, and a row with one finite logit.
  const std::vector<float> x = {-kInf, -kInf, -kInf, -kInf,  //
                                -kInf, 1.0f,  2.0f,  -kInf,  //
                                -kInf, -kInf, 0.5f,  -kInf};
  Tensor tx = MakeTensor(dtype, {3, cols}, x);
  Tensor ty = MakeZeros(dtype, {3, cols});
  NF_ASSERT_OK(ops::SoftmaxForward(tx, ty));
  const std::vector<double> y = ToDoubles(ty);
  const double p2 = 1.0 / (1.0 + std::exp(-1.0));  // softmax(1, 2) = (1 - p2, p2)
  // exp(-inf) is exactly 0 and a lone finite logit has probability exactly 1; the two-way
  // split carries the fp32 computation (20 u32, as above) and the output rounding u.
  const double rtol = 20 * kU32 + UnitRoundoff(dtype);
  ExpectAllClose(y, {0, 0, 0, 0, 0, 1 - p2, p2, 0, 0, 0, 1, 0}, 0.0, rtol, "masked softmax");

  // Gradients through masked entries vanish: y = 0 there, and the whole first row is zero.
  Tensor tdy = MakeTensor(dtype, {3, cols}, RandomFloats(3 * cols, 3));
  Tensor tdx = MakeZeros(dtype, {3, cols});
  NF_ASSERT_OK(ops::SoftmaxBackward(ty, tdy, tdx));
  const std::vector<double> dx = ToDoubles(tdx);
  for (int i : {0, 1, 2, 3, 4, 7, 8, 9, 11}) EXPECT_EQ(dx[i], 0.0) << i;
  // A lone probability of 1 has zero gradient: dy - 1 * dy, exact in fp32.
  EXPECT_EQ(dx[10], 0.0);
  EXPECT_NE(dx[5], 0.0);
}

TEST(SoftmaxTest, HugeLogitsStayFinite) {
  // Magnitudes that overflow exp() without the max shift (fp32 only: fp16 cannot hold them).
  const std::vector<float> x = {1e30f,  -1e30f, 0.0f,   1e30f,   // two maxima
                                -1e30f, -1e30f, -1e30f, -1e30f,  // all equal and very negative
                                3e38f,  -3e38f, 1.0f,   -1.0f};  // near the fp32 limit
  Tensor tx = MakeTensor(DType::kF32, {3, 4}, x);
  Tensor ty = MakeZeros(DType::kF32, {3, 4});
  NF_ASSERT_OK(ops::SoftmaxForward(tx, ty));
  const std::vector<double> y = ToDoubles(ty);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_TRUE(std::isfinite(y[i])) << i;
  // Every expected value is 0, 1/2, 1/4 or 1: exact in fp32 through the kernel's exp
  // (exp(0) = 1, exp(-huge) = 0) and scaling by 1/2 or 1/4, so no tolerance is needed.
  ExpectAllClose(y, {0.5, 0, 0, 0.5, 0.25, 0.25, 0.25, 0.25, 1, 0, 0, 0}, 0.0, 0.0, "huge");
}

// 400 rows of 16: the kernels split them into thread-pool chunks (~100 rows each). Every row
// must still match the reference: the forward as above, the backward against the analytic
// float64 gradient y (dy - sum(y dy)) (the finite-difference test above validates that formula
// on small shapes) with the same error model as ForwardAndBackwardMatchReference.
TEST(SoftmaxTest, ChunkedRowsMatchReference) {
  const int64_t rows = 400, cols = 16;
  const Input x(DType::kF32, rows * cols, 4, -4.0f, 4.0f), dy(DType::kF32, rows * cols, 5);
  Tensor ty = MakeZeros(DType::kF32, {rows, cols});
  NF_ASSERT_OK(ops::SoftmaxForward(MakeTensor(DType::kF32, {rows, cols}, x.f), ty));
  const std::vector<double> y_ref = ReferenceSoftmax(x.d, rows, cols);
  const double y_rtol = 20 * kU32;
  ExpectAllClose(ToDoubles(ty), y_ref, 0.0, y_rtol, "chunked softmax y");
  Tensor tdx = MakeZeros(DType::kF32, {rows, cols});
  NF_ASSERT_OK(ops::SoftmaxBackward(ty, MakeTensor(DType::kF32, {rows, cols}, dy.f), tdx));
  std::vector<double> dx_ref(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0.0;
    for (int64_t c = 0; c < cols; ++c) dot += y_ref[r * cols + c] * dy.d[r * cols + c];
    for (int64_t c = 0; c < cols; ++c) {
      dx_ref[r * cols + c] = y_ref[r * cols + c] * (dy.d[r * cols + c] - dot);
    }
  }
  ExpectAllClose(ToDoubles(tdx), dx_ref, 2 * MaxAbs(dy.d) * (3 * y_rtol + 4 * kU32), kU32,
                 "chunked softmax dx");
}

// ---- Attention ---------------------------------------------------------------------------------

struct Dims {
  int64_t batch, heads, seq, dim;
  int64_t numel() const { return batch * heads * seq * dim; }
  Shape shape() const { return {batch, heads, seq, dim}; }
};

// The dropout multiplier of probability (b, h, i, j) as documented in ops.h and core/philox.h:
// sample = first_sample + b, head = head_offset + h, row = query i, col = key j; kept iff the
// Philox word is >= DropoutThreshold(p), scaled by 1 / (1 - p).
double DropoutMultiplier(const ops::DropoutSpec& spec, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (spec.p == 0.0f) return 1.0;
  const PhiloxCounter words =
      DropoutWords(spec.seed, spec.site, spec.first_sample + b, spec.head_offset + h, i, j);
  return words[j % 4] >= DropoutThreshold(spec.p) ? 1.0 / (1.0 - static_cast<double>(spec.p)) : 0.0;
}

// The keys query i attends: 0 .. i with the causal mask, every one of the seq without.
int64_t VisibleKeys(bool causal, int64_t i, int64_t seq) { return causal ? i + 1 : seq; }

struct RefAttention {
  std::vector<double> out, lse;
};

// out_i = sum_{j visible} softmax_j(scale q_i . k_j) m_ij v_j and lse_i = log sum_{j visible}
// exp(...), j visible for j <= i when causal and for every j otherwise.
RefAttention ReferenceAttention(const std::vector<double>& q, const std::vector<double>& k,
                                const std::vector<double>& v, const Dims& n, double scale,
                                const ops::DropoutSpec& spec, bool causal) {
  RefAttention ref{std::vector<double>(n.numel(), 0.0),
                   std::vector<double>(n.batch * n.heads * n.seq)};
  std::vector<double> s(n.seq);
  for (int64_t b = 0; b < n.batch; ++b) {
    for (int64_t h = 0; h < n.heads; ++h) {
      const int64_t base = (b * n.heads + h) * n.seq;
      for (int64_t i = 0; i < n.seq; ++i) {
        const int64_t keys = VisibleKeys(causal, i, n.seq);
        double max = -INFINITY;
        for (int64_t j = 0; j < keys; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < n.dim; ++d) {
            dot += q[(base + i) * n.dim + d] * k[(base + j) * n.dim + d];
          }
          s[j] = scale * dot;
          max = std::max(max, s[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < keys; ++j) sum += std::exp(s[j] - max);
        const double lse = max + std::log(sum);
        ref.lse[base + i] = lse;
        for (int64_t j = 0; j < keys; ++j) {
          const double p = std::exp(s[j] - lse) * DropoutMultiplier(spec, b, h, i, j);
          for (int64_t d = 0; d < n.dim; ++d) {
            ref.out[(base + i) * n.dim + d] += p * v[(base + j) * n.dim + d];
          }
        }
      }
    }
  }
  return ref;
}

struct AttentionResult {
  std::vector<double> out, lse, dq, dk, dv;
};

// Forward then backward of the kernels on the given (already rounded) inputs.
AttentionResult RunAttention(DType dtype, const Dims& n, float scale, const ops::DropoutSpec& spec,
                             bool causal, const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v, const std::vector<float>& dout) {
  ops::AttentionArgs fwd;
  fwd.q = MakeTensor(dtype, n.shape(), q);
  fwd.k = MakeTensor(dtype, n.shape(), k);
  fwd.v = MakeTensor(dtype, n.shape(), v);
  fwd.out = MakeZeros(dtype, n.shape());
  fwd.lse = MakeZeros(DType::kF32, {n.batch, n.heads, n.seq});
  fwd.scale = scale;
  fwd.dropout = spec;
  fwd.causal = causal;
  const absl::Status forward = ops::AttentionForward(fwd);
  NF_EXPECT_OK(forward);
  ops::AttentionBackwardArgs bwd;
  bwd.q = fwd.q;
  bwd.k = fwd.k;
  bwd.v = fwd.v;
  bwd.out = fwd.out;
  bwd.lse = fwd.lse;
  bwd.dout = MakeTensor(dtype, n.shape(), dout);
  bwd.dq = MakeZeros(dtype, n.shape());
  bwd.dk = MakeZeros(dtype, n.shape());
  bwd.dv = MakeZeros(dtype, n.shape());
  bwd.scale = scale;
  bwd.dropout = spec;
  bwd.causal = causal;
  const absl::Status backward = ops::AttentionBackward(bwd);
  NF_EXPECT_OK(backward);
  return {ToDoubles(fwd.out), ToDoubles(fwd.lse), ToDoubles(bwd.dq), ToDoubles(bwd.dk),
          ToDoubles(bwd.dv)};
}

// Per-element error bounds of the kernels' fp32 arithmetic: the reference formulas evaluated on
// magnitudes, each term weighted by its relative error. p_err bounds the relative error of a
// probability; an sgemm sum of n terms adds n u32 of the sum of the terms' magnitudes; u_out is
// the rounding of the stored `out` (0 for fp32) that the backward's row term dO_i . O_i reads on
// top of the forward's own error.
struct AttentionBounds {
  std::vector<double> out, dq, dk, dv;
};
AttentionBounds ErrorBounds(const std::vector<double>& q, const std::vector<double>& k,
                            const std::vector<double>& v, const std::vector<double>& dout,
                            const std::vector<double>& out, const Dims& n, double scale,
                            const ops::DropoutSpec& spec, bool causal, double p_err, double u_out) {
  const int64_t s = n.seq, dim = n.dim;
  AttentionBounds bound{std::vector<double>(n.numel(), 0.0), std::vector<double>(n.numel(), 0.0),
                        std::vector<double>(n.numel(), 0.0), std::vector<double>(n.numel(), 0.0)};
  const double sum_err = p_err + s * kU32;             // P V and P'^T dO
  const double ds_err = p_err + (dim + s + 2) * kU32;  // dS, then dS K and dS^T Q
  std::vector<double> p(s * s), m(s * s);
  for (int64_t bh = 0; bh < n.batch * n.heads; ++bh) {
    const int64_t b = bh / n.heads, h = bh % n.heads, base = bh * s * dim;
    const auto at = [&](const std::vector<double>& t, int64_t row, int64_t d) {
      return t[base + row * dim + d];
    };
    for (int64_t i = 0; i < s; ++i) {
      const int64_t keys = VisibleKeys(causal, i, s);
      std::vector<double> scores(keys);
      double max = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < keys; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < dim; ++d) dot += at(q, i, d) * at(k, j, d);
        scores[j] = scale * dot;
        max = std::max(max, scores[j]);
      }
      for (int64_t j = 0; j < keys; ++j) sum += std::exp(scores[j] - max);
      for (int64_t j = 0; j < keys; ++j) {
        p[i * s + j] = std::exp(scores[j] - max) / sum;
        m[i * s + j] = DropoutMultiplier(spec, b, h, i, j);
        for (int64_t d = 0; d < dim; ++d) {
          bound.out[base + i * dim + d] +=
              sum_err * p[i * s + j] * m[i * s + j] * std::abs(at(v, j, d));
        }
      }
    }
    for (int64_t i = 0; i < s; ++i) {
      // The row term's magnitude sum_d |dO_id O_id| and its error: the stored O's (forward bound
      // plus rounding) and the term's own rounding to fp32.
      double row_dot = 0.0, row_err = 0.0;
      for (int64_t d = 0; d < dim; ++d) {
        row_dot += std::abs(at(dout, i, d) * at(out, i, d));
        row_err += std::abs(at(dout, i, d)) *
                   (bound.out[base + i * dim + d] + u_out * std::abs(at(out, i, d)));
      }
      row_err += kU32 * row_dot;
      for (int64_t j = 0; j < VisibleKeys(causal, i, s); ++j) {
        double dp = 0.0;  // |m_ij dO_i . v_j| bound
        for (int64_t d = 0; d < dim; ++d) {
          bound.dv[base + j * dim + d] +=
              sum_err * p[i * s + j] * m[i * s + j] * std::abs(at(dout, i, d));
          dp += m[i * s + j] * std::abs(at(dout, i, d) * at(v, j, d));
        }
        const double ds = p[i * s + j] * (ds_err * (dp + row_dot) + row_err);
        for (int64_t d = 0; d < dim; ++d) {
          bound.dq[base + i * dim + d] += scale * ds * std::abs(at(k, j, d));
          bound.dk[base + j * dim + d] += scale * ds * std::abs(at(q, i, d));
        }
      }
    }
  }
  return bound;
}

// Bound on |scale q_i . k_j| over the inputs.
double ScoreBound(const std::vector<double>& q, const std::vector<double>& k, const Dims& n,
                  double scale) {
  return scale * n.dim * MaxAbs(q) * MaxAbs(k);
}

// fp32 error of a probability, relative: the score (a dim-term sgemm dot product, within dim u32
// of scale sum|q||k| <= score_bound) enters exp() twice (directly and through lse), plus ~8 fp32
// roundings of arguments up to 1 + score_bound, plus the fp32 exp's own error in the numerator
// and in the sum (the forward) or in the lse (the backward's recomputation): 2 kExpRel.
double ProbabilityError(double score_bound, const Dims& n) {
  return kU32 * (2 * n.dim * score_bound + 8 * (1 + score_bound)) + 2 * kExpRel;
}

// Expects |actual - expected| <= 2 bound + kFdError + rtol |expected| elementwise: twice the
// derived fp32 bound, the finite-difference error, and the output rounding (rtol = u).
void ExpectWithinBounds(const std::vector<double>& actual, const std::vector<double>& expected,
                        const std::vector<double>& bound, double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double worst = -INFINITY;
  size_t worst_index = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double tol = 2 * bound[i] + kFdError + rtol * std::abs(expected[i]);
    const double ratio = std::abs(actual[i] - expected[i]) / tol;
    if (!(ratio <= worst)) {
      worst = std::isnan(ratio) ? INFINITY : ratio;
      worst_index = i;
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_index << " is " << actual[worst_index]
                        << ", expected " << expected[worst_index] << " within "
                        << 2 * bound[worst_index] + kFdError << " + " << rtol << " relative";
}

// Checks forward and backward of one configuration against the float64 reference and finite
// differences of sum(out * dout).
void CheckAttention(DType dtype, const Dims& n, const ops::DropoutSpec& spec, bool causal,
                    uint32_t seed) {
  SCOPED_TRACE(::testing::Message()
               << DTypeName(dtype) << " [" << n.batch << ", " << n.heads << ", " << n.seq << ", "
               << n.dim << "] p=" << spec.p << (causal ? " causal" : " non-causal"));
  const float scale = 1.0f / std::sqrt(static_cast<float>(n.dim));
  const Input q(dtype, n.numel(), seed), k(dtype, n.numel(), seed + 1),
      v(dtype, n.numel(), seed + 2), dout(dtype, n.numel(), seed + 3);
  const AttentionResult got = RunAttention(dtype, n, scale, spec, causal, q.f, k.f, v.f, dout.f);
  const RefAttention ref = ReferenceAttention(q.d, k.d, v.d, n, scale, spec, causal);

  const double u = UnitRoundoff(dtype);
  const double score_bound = ScoreBound(q.d, k.d, n, scale);
  const double p_err = ProbabilityError(score_bound, n);
  // fp16 / bf16: the stored `out` that the backward reads is rounded (u), not just fp32.
  const AttentionBounds bound = ErrorBounds(q.d, k.d, v.d, dout.d, ref.out, n, scale, spec, causal,
                                            p_err, dtype == DType::kF32 ? 0.0 : u);
  ExpectWithinBounds(got.out, ref.out, bound.out, u, "out");
  // lse = max + log(sum) in fp32: the score error (dim u32 of score_bound, twice), the sum's exp
  // error (kExpRel relative, absolute on its log) plus a few roundings of values up to |lse|.
  ExpectAllClose(got.lse, ref.lse,
                 kU32 * (2 * n.dim * score_bound + 4 * (1 + MaxAbs(ref.lse))) + kExpRel, 0.0,
                 "lse");

  const auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk,
                        const std::vector<double>& vv) {
    const RefAttention r = ReferenceAttention(qq, kk, vv, n, scale, spec, causal);
    double sum = 0.0;
    for (size_t i = 0; i < r.out.size(); ++i) sum += r.out[i] * dout.d[i];
    return sum;
  };
  const std::vector<double> dq_ref =
      NumericGradient([&](const std::vector<double>& x) { return loss(x, k.d, v.d); }, q.d, 1e-5);
  const std::vector<double> dk_ref =
      NumericGradient([&](const std::vector<double>& x) { return loss(q.d, x, v.d); }, k.d, 1e-5);
  const std::vector<double> dv_ref =
      NumericGradient([&](const std::vector<double>& x) { return loss(q.d, k.d, x); }, v.d, 1e-5);
  ExpectWithinBounds(got.dq, dq_ref, bound.dq, u, "dq");
  ExpectWithinBounds(got.dk, dk_ref, bound.dk, u, "dk");
  ExpectWithinBounds(got.dv, dv_ref, bound.dv, u, "dv");
}

TEST(AttentionTest, Float32MatchesReferenceAndFiniteDifferences) {
  for (const Dims& n : {Dims{2, 3, 5, 4}, Dims{1, 1, 1, 8}, Dims{1, 2, 17, 8}}) {
    CheckAttention(DType::kF32, n, ops::DropoutSpec{}, /*causal=*/true, 10);
  }
}

TEST(AttentionTest, HalfPrecisionMatchesReferenceAndFiniteDifferences) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (const Dims& n : {Dims{2, 3, 5, 4}, Dims{1, 2, 17, 8}}) {
      CheckAttention(dtype, n, ops::DropoutSpec{}, /*causal=*/true, 20);
    }
  }
}

TEST(AttentionTest, NonCausalFloat32MatchesReferenceAndFiniteDifferences) {
  for (const Dims& n : {Dims{2, 3, 5, 4}, Dims{1, 1, 1, 8}, Dims{1, 2, 17, 8}}) {
    CheckAttention(DType::kF32, n, ops::DropoutSpec{}, /*causal=*/false, 11);
  }
}

TEST(AttentionTest, NonCausalHalfPrecisionMatchesReferenceAndFiniteDifferences) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (const Dims& n : {Dims{2, 3, 5, 4}, Dims{1, 2, 17, 8}}) {
      CheckAttention(dtype, n, ops::DropoutSpec{}, /*causal=*/false, 21);
    }
  }
}

ops::DropoutSpec TestDropout(int64_t head_offset) {
  ops::DropoutSpec spec;
  spec.p = 0.3f;
  spec.seed = 1234;
  spec.site = 7;
  spec.first_sample = 5;
  spec.head_offset = head_offset;
  spec.seq_len = 999;    // unused by attention
  spec.col_offset = 64;  // unused by attention
  return spec;
}

TEST(AttentionTest, DropoutMatchesReferenceMaskForwardAndBackward) {
  const Dims n{2, 2, 9, 4};  // 9 key positions span three Philox calls per row
  const ops::DropoutSpec spec = TestDropout(3);
  // The mask must actually drop some probabilities and keep others, or the test is vacuous.
  int64_t kept = 0, dropped = 0;
  for (int64_t b = 0; b < n.batch; ++b) {
    for (int64_t h = 0; h < n.heads; ++h) {
      for (int64_t i = 0; i < n.seq; ++i) {
        for (int64_t j = 0; j <= i; ++j) {
          if (DropoutMultiplier(spec, b, h, i, j) == 0.0) {
            ++dropped;
          } else {
            ++kept;
          }
        }
      }
    }
  }
  EXPECT_GT(dropped, 0);
  EXPECT_GT(kept, 0);
  CheckAttention(DType::kF32, n, spec, /*causal=*/true, 30);
  CheckAttention(DType::kF16, n, spec, /*causal=*/true, 40);
  CheckAttention(DType::kF32, Dims{1, 1, 17, 8}, TestDropout(0), /*causal=*/true, 50);
}

// Without the causal mask the multipliers cover whole rows, keyed by the same (sample, head,
// query, key) coordinates: the reference draws them for the keys after each query too.
TEST(AttentionTest, NonCausalDropoutMatchesReferenceMaskForwardAndBackward) {
  const Dims n{2, 2, 9, 4};
  const ops::DropoutSpec spec = TestDropout(3);
  // Some probabilities above the diagonal (key after query) are dropped and some kept, so the
  // test sees whether the kernels apply the mask there.
  int64_t kept = 0, dropped = 0;
  for (int64_t b = 0; b < n.batch; ++b) {
    for (int64_t h = 0; h < n.heads; ++h) {
      for (int64_t i = 0; i < n.seq; ++i) {
        for (int64_t j = i + 1; j < n.seq; ++j) {
          if (DropoutMultiplier(spec, b, h, i, j) == 0.0) {
            ++dropped;
          } else {
            ++kept;
          }
        }
      }
    }
  }
  EXPECT_GT(dropped, 0);
  EXPECT_GT(kept, 0);
  CheckAttention(DType::kF32, n, spec, /*causal=*/false, 31);
  CheckAttention(DType::kF16, n, spec, /*causal=*/false, 41);
  CheckAttention(DType::kBF16, n, spec, /*causal=*/false, 45);
  CheckAttention(DType::kF32, Dims{1, 1, 17, 8}, TestDropout(0), /*causal=*/false, 51);
}

// The flag is not ignored: on the same inputs (dropout included), the last query attends every
// key either way, so its output, lse and dq agree, while the first query attends key 0 alone
// with the mask and all keys without, so its output and lse differ.
TEST(AttentionTest, NonCausalDiffersFromCausalButForTheLastQuery) {
  const Dims n{2, 3, 7, 4};
  const float scale = 0.5f;
  const std::vector<float> q = RandomFloats(n.numel(), 80), k = RandomFloats(n.numel(), 81),
                           v = RandomFloats(n.numel(), 82), dout = RandomFloats(n.numel(), 83);
  const ops::DropoutSpec spec = TestDropout(1);
  const AttentionResult causal = RunAttention(DType::kF32, n, scale, spec, true, q, k, v, dout);
  const AttentionResult full = RunAttention(DType::kF32, n, scale, spec, false, q, k, v, dout);
  // Row `row` of every (batch, head) pair of a [batch, heads, seq, width] result.
  const auto rows = [&](const std::vector<double>& t, int64_t row, int64_t width) {
    std::vector<double> picked;
    for (int64_t bh = 0; bh < n.batch * n.heads; ++bh) {
      const auto begin = t.begin() + (bh * n.seq + row) * width;
      picked.insert(picked.end(), begin, begin + width);
    }
    return picked;
  };
  const int64_t last = n.seq - 1;
  // The same row from the same code and values: equal to the last bit in practice (the
  // tolerances of HeadShardMatchesFullCall).
  ExpectAllClose(rows(full.out, last, n.dim), rows(causal.out, last, n.dim), 1e-12, 2 * kU32,
                 "last query out");
  ExpectAllClose(rows(full.lse, last, 1), rows(causal.lse, last, 1), 1e-12, 2 * kU32,
                 "last query lse");
  ExpectAllClose(rows(full.dq, last, n.dim), rows(causal.dq, last, n.dim), 1e-12, 2 * kU32,
                 "last query dq");
  // The first query: the causal lse is its single score s_0, the bidirectional one
  // log(exp(s_0) + six more terms), larger by at least log(1 + 6 exp(-4)) > 0.1 since
  // |score| <= scale dim = 2.
  const std::vector<double> causal_lse = rows(causal.lse, 0, 1), full_lse = rows(full.lse, 0, 1);
  for (size_t p = 0; p < causal_lse.size(); ++p) EXPECT_GT(full_lse[p] - causal_lse[p], 0.1) << p;
  const std::vector<double> causal_out = rows(causal.out, 0, n.dim),
                            full_out = rows(full.out, 0, n.dim);
  double diff = 0.0;
  for (size_t e = 0; e < causal_out.size(); ++e) {
    diff = std::max(diff, std::abs(full_out[e] - causal_out[e]));
  }
  EXPECT_GT(diff, 1e-2);
}

// Heads [2, 4) of a 4-head input, run alone with head_offset = 2, reproduce the full call's
// heads 2 and 3 (forward and backward, dropout included), with and without the causal mask: a
// tensor-parallel rank holding those heads computes exactly what the unsharded model would.
TEST(AttentionTest, HeadShardMatchesFullCall) {
  const Dims full{2, 4, 6, 4}, shard{2, 2, 6, 4};
  const int64_t first_head = 2, per_head = full.seq * full.dim;
  const float scale = 0.5f;
  const std::vector<float> q = RandomFloats(full.numel(), 60), k = RandomFloats(full.numel(), 61),
                           v = RandomFloats(full.numel(), 62),
                           dout = RandomFloats(full.numel(), 63);
  // Heads [2, 4) of every sample, and the same selection of [.., seq(, dim)] results.
  const auto heads = [&](const auto& t, int64_t per) {
    std::vector<typename std::decay_t<decltype(t)>::value_type> out;
    for (int64_t b = 0; b < full.batch; ++b) {
      const auto begin = t.begin() + (b * full.heads + first_head) * per;
      out.insert(out.end(), begin, begin + shard.heads * per);
    }
    return out;
  };
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    const AttentionResult all =
        RunAttention(DType::kF32, full, scale, TestDropout(0), causal, q, k, v, dout);
    const AttentionResult part =
        RunAttention(DType::kF32, shard, scale, TestDropout(first_head), causal, heads(q, per_head),
                     heads(k, per_head), heads(v, per_head), heads(dout, per_head));
    // Each (batch, head) pair is computed on its own by the same code from the same values, so
    // the results agree to the last bit in practice; 2 u32 relative (plus 1e-12 absolute for
    // values that cancel to ~0) only allows a BLAS that rounds differently for another memory
    // alignment. A wrong head coordinate changes the dropout mask and moves values by O(0.1).
    ExpectAllClose(part.out, heads(all.out, per_head), 1e-12, 2 * kU32, "shard out");
    ExpectAllClose(part.lse, heads(all.lse, full.seq), 1e-12, 2 * kU32, "shard lse");
    ExpectAllClose(part.dq, heads(all.dq, per_head), 1e-12, 2 * kU32, "shard dq");
    ExpectAllClose(part.dk, heads(all.dk, per_head), 1e-12, 2 * kU32, "shard dk");
    ExpectAllClose(part.dv, heads(all.dv, per_head), 1e-12, 2 * kU32, "shard dv");
    // And the offset matters: the same shard without head_offset draws other masks.
    const AttentionResult wrong =
        RunAttention(DType::kF32, shard, scale, TestDropout(0), causal, heads(q, per_head),
                     heads(k, per_head), heads(v, per_head), heads(dout, per_head));
    double diff = 0.0;
    const std::vector<double> expected = heads(all.out, per_head);
    for (size_t i = 0; i < expected.size(); ++i) {
      diff = std::max(diff, std::abs(wrong.out[i] - expected[i]));
    }
    EXPECT_GT(diff, 1e-3);
  }
}

// [2, 4, 32, 16]: each (batch, head) pair is ~65k flops, a thread-pool chunk of its own, so the
// 8 pairs spread over the threads. The call must equal 8 single-pair calls whose first_sample
// and head_offset give each pair its original dropout coordinates (every chunk indexes its own
// pair, and the masks do not depend on the split), and its forward must match the reference;
// with and without the causal mask.
TEST(AttentionTest, ChunkedPairsMatchSinglePairCalls) {
  const Dims full{2, 4, 32, 16}, one{1, 1, 32, 16};
  const int64_t per_pair = one.numel();
  const float scale = 0.25f;
  const ops::DropoutSpec spec = TestDropout(1);
  const std::vector<float> q = RandomFloats(full.numel(), 70), k = RandomFloats(full.numel(), 71),
                           v = RandomFloats(full.numel(), 72),
                           dout = RandomFloats(full.numel(), 73);
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    const AttentionResult all = RunAttention(DType::kF32, full, scale, spec, causal, q, k, v, dout);

    AttentionResult pairs;
    for (int64_t b = 0; b < full.batch; ++b) {
      for (int64_t h = 0; h < full.heads; ++h) {
        const int64_t offset = (b * full.heads + h) * per_pair;
        const auto pair = [&](const std::vector<float>& t) {
          return std::vector<float>(t.begin() + offset, t.begin() + offset + per_pair);
        };
        ops::DropoutSpec pair_spec = spec;
        pair_spec.first_sample += b;
        pair_spec.head_offset += h;
        const AttentionResult r = RunAttention(DType::kF32, one, scale, pair_spec, causal, pair(q),
                                               pair(k), pair(v), pair(dout));
        for (auto [to, from] : {std::pair{&pairs.out, &r.out}, std::pair{&pairs.lse, &r.lse},
                                std::pair{&pairs.dq, &r.dq}, std::pair{&pairs.dk, &r.dk},
                                std::pair{&pairs.dv, &r.dv}}) {
          to->insert(to->end(), from->begin(), from->end());
        }
      }
    }
    // As in HeadShardMatchesFullCall: the same code on the same values.
    ExpectAllClose(all.out, pairs.out, 1e-12, 2 * kU32, "chunked out");
    ExpectAllClose(all.lse, pairs.lse, 1e-12, 2 * kU32, "chunked lse");
    ExpectAllClose(all.dq, pairs.dq, 1e-12, 2 * kU32, "chunked dq");
    ExpectAllClose(all.dk, pairs.dk, 1e-12, 2 * kU32, "chunked dk");
    ExpectAllClose(all.dv, pairs.dv, 1e-12, 2 * kU32, "chunked dv");

    // The forward against the float64 reference, with the bounds of CheckAttention.
    const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()),
        vd(v.begin(), v.end()), dod(dout.begin(), dout.end());
    const RefAttention ref = ReferenceAttention(qd, kd, vd, full, scale, spec, causal);
    const double p_err = ProbabilityError(ScoreBound(qd, kd, full, scale), full);
    const AttentionBounds bound =
        ErrorBounds(qd, kd, vd, dod, ref.out, full, scale, spec, causal, p_err, 0.0);
    ExpectWithinBounds(all.out, ref.out, bound.out, kU32, "chunked out vs reference");
  }
}

TEST(AttentionTest, RejectsInconsistentArguments) {
  const Dims n{1, 2, 3, 4};
  const auto f32 = [](Shape s) { return MakeZeros(DType::kF32, s); };
  ops::AttentionArgs good;
  good.q = f32(n.shape());
  good.k = f32(n.shape());
  good.v = f32(n.shape());
  good.out = f32(n.shape());
  good.lse = f32({1, 2, 3});
  NF_ASSERT_OK(ops::AttentionForward(good));
  const auto expect_invalid = [](const absl::Status& status, const std::string& what) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(what)) << status;
  };
  ops::AttentionArgs a = good;
  a.q = f32({2, 3, 4});
  expect_invalid(ops::AttentionForward(a), "q");
  a = good;
  a.k = f32({1, 2, 4, 4});
  expect_invalid(ops::AttentionForward(a), "k");
  a = good;
  a.v = MakeZeros(DType::kF16, n.shape());
  expect_invalid(ops::AttentionForward(a), "v");
  a = good;
  a.lse = f32({1, 2, 4});
  expect_invalid(ops::AttentionForward(a), "lse");
  a = good;
  a.lse = MakeZeros(DType::kF16, {1, 2, 3});
  expect_invalid(ops::AttentionForward(a), "lse");
  a = good;
  a.dropout.p = 1.0f;
  expect_invalid(ops::AttentionForward(a), "dropout");
  a = good;
  a.dropout.head_offset = -1;
  expect_invalid(ops::AttentionForward(a), "dropout");

  ops::AttentionBackwardArgs b;
  b.q = b.k = b.v = b.out = b.dout = b.dq = b.dk = b.dv = f32(n.shape());
  b.lse = f32({1, 2, 3});
  NF_ASSERT_OK(ops::AttentionBackward(b));
  b.dk = f32({1, 2, 3, 5});
  expect_invalid(ops::AttentionBackward(b), "dk");
  b.dk = f32(n.shape());
  b.dout = MakeZeros(DType::kBF16, n.shape());
  expect_invalid(ops::AttentionBackward(b), "dout");

  expect_invalid(ops::SoftmaxForward(f32({2, 3}), f32({3, 2})), "y");
  expect_invalid(ops::SoftmaxBackward(f32({2, 3}), f32({2, 3}), MakeZeros(DType::kF16, {2, 3})),
                 "dx");
}

}  // namespace
}  // namespace nf
