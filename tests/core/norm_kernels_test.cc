// The vectorised LayerNorm kernels (core/cpu/isa/norm_kernels.h) at every ISA level this CPU
// runs, against float64 references written here, on widths that exercise the 16-lane main loop
// and its tail (1, 3, 17, 130, 768) and on rows centred near 0 and near 1e4.
//
// Error model. Inputs are fp32 and read exactly. Row sums are double (n terms: error at most
// n 2^-53 of the sum of magnitudes, far below the fp32 roundings); mean and rstd are rounded to
// fp32 once (u32 relative; rstd's sqrt and division in double add ~1e-16). The kernels form
// xhat = (x - mean) * rstd in fp32: two roundings, 2 u32 |xhat|, with mean and rstd given (the
// backward) or the fp32 ones of the forward (whose rounding of mean, u32 |mean|, shifts xhat by
// u32 |mean| rstd). Each further fp32 operation adds u32 of its result's magnitude. The
// backward computes in fp32: a sum of n terms over the 32 fixed lanes goes through at most
// L(n) = ceil(n / 32) + 5 roundings per term, so its error is at most L u32 times the sum of the
// terms' magnitudes.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cpu/isa/norm_kernels.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf::cpu {
namespace {

using ::nf::testing::kU32;
using ::nf::testing::RandomFloats;

constexpr float kEps = 1e-5f;
constexpr double kU64 = 0x1p-53;

// Roundings a term goes through in a fixed-lane fp32 sum of n terms.
double LaneRoundings(int64_t n) { return static_cast<double>((n + 31) / 32 + 5); }
const std::vector<int64_t> kWidths = {1, 3, 17, 130, 768};
constexpr int64_t kRows = 3;

// Expects |actual[i] - expected[i]| <= tol[i].
void ExpectWithin(const std::vector<float>& actual, const std::vector<double>& expected,
                  const std::vector<double>& tol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_LE(std::abs(actual[i] - expected[i]), tol[i])
        << what << " [" << i << "]: " << actual[i] << ", expected " << expected[i];
  }
}

// Inputs of one width: x [kRows, cols] in [offset - 2, offset + 2), weight, bias, dy.
struct Inputs {
  int64_t cols;
  std::vector<float> x, w, b, dy;
  Inputs(int64_t c, float offset, uint32_t seed)
      : cols(c),
        x(RandomFloats(kRows * c, seed, offset - 2.0f, offset + 2.0f)),
        w(RandomFloats(c, seed + 1, 0.5f, 1.5f)),
        b(RandomFloats(c, seed + 2, -0.5f, 0.5f)),
        dy(RandomFloats(kRows * c, seed + 3)) {}
};

// Two-pass float64 statistics of row r.
void ReferenceStats(const Inputs& in, int64_t r, double& mean, double& rstd) {
  double sum = 0.0, squares = 0.0;
  for (int64_t c = 0; c < in.cols; ++c) sum += in.x[r * in.cols + c];
  mean = sum / in.cols;
  for (int64_t c = 0; c < in.cols; ++c) {
    const double d = in.x[r * in.cols + c] - mean;
    squares += d * d;
  }
  rstd = 1.0 / std::sqrt(squares / in.cols + double{kEps});
}

class NormKernelsTest : public ::testing::TestWithParam<float> {};  // the rows' offset
INSTANTIATE_TEST_SUITE_P(Offsets, NormKernelsTest, ::testing::Values(0.0f, 1e4f));

TEST_P(NormKernelsTest, ForwardAndNormalizeMatchFloat64) {
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const NormKernels& k = NormKernelsFor(isa);
    for (int64_t cols : kWidths) {
      const Inputs in(cols, GetParam(), 100 + cols);
      std::vector<float> y(kRows * cols), mean(kRows), rstd(kRows);
      k.forward(in.x.data(), in.w.data(), in.b.data(), kRows, cols, kEps, y.data(), mean.data(),
                rstd.data());
      std::vector<double> y_ref(kRows * cols), y_tol(kRows * cols);
      for (int64_t r = 0; r < kRows; ++r) {
        double mu, rs;
        ReferenceStats(in, r, mu, rs);
        // One fp32 rounding each, plus the double sums' ~1e-16 (2 u32 leaves room for both).
        EXPECT_NEAR(mean[r], mu, 2 * kU32 * std::abs(mu) + 1e-30) << cols;
        EXPECT_NEAR(rstd[r], rs, 2 * kU32 * rs) << cols;
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = r * cols + c;
          const double xhat = (in.x[i] - mu) * rs;
          y_ref[i] = xhat * in.w[c] + in.b[c];
          // The fp32 mean's and rstd's roundings move xhat by u32 (|mean| rstd + |xhat|); xhat's
          // two roundings and y's two (product, sum) add 4 u32 of |xhat| |w| + |b|.
          y_tol[i] = 2 * kU32 * (std::abs(mu) * rs + std::abs(xhat)) * in.w[c] +
                     4 * kU32 * (std::abs(xhat) * in.w[c] + std::abs(in.b[c]));
        }
      }
      ExpectWithin(y, y_ref, y_tol, "forward y, cols " + std::to_string(cols));
      // normalize with the forward's statistics does the forward's elementwise arithmetic.
      std::vector<float> y2(kRows * cols);
      k.normalize(in.x.data(), in.w.data(), in.b.data(), mean.data(), rstd.data(), kRows, cols,
                  y2.data());
      EXPECT_EQ(y2, y) << cols;
    }
  }
}

// The forward's one-pass statistics shift each row by its first element, losing the bits of
// (mean - first)^2 / var: a first element far out in the tail is the worst case, at most
// log2(cols) bits of double's 53 (12 at 4096). Mean and rstd must stay within the fp32 rounding
// of the float64 reference there, and for a constant row.
TEST(NormKernelsOutlierTest, FirstElementFarFromTheMeanKeepsStatisticsExact) {
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(IsaName(isa));
    for (const int64_t cols : {768, 4096}) {
      for (const float outlier : {1e3f, -3e5f, 1.0f}) {
        Inputs in(cols, 0.0f, 400 + cols);
        in.x.resize(cols);                                   // one row
        const float spread = outlier == 1.0f ? 0.0f : 1.0f;  // 1.0: a constant row of ones
        for (float& v : in.x) v = outlier == 1.0f ? 1.0f : v * spread;
        in.x[0] = outlier;
        std::vector<float> y(cols), mean(1), rstd(1);
        NormKernelsFor(isa).forward(in.x.data(), in.w.data(), in.b.data(), 1, cols, kEps, y.data(),
                                    mean.data(), rstd.data());
        double mu = 0.0, squares = 0.0;
        for (const float v : in.x) mu += v;
        mu /= cols;
        for (const float v : in.x) squares += (v - mu) * (v - mu);
        const double rs = 1.0 / std::sqrt(squares / cols + double{kEps});
        EXPECT_NEAR(mean[0], mu, 2 * kU32 * std::abs(mu) + 1e-30) << cols << " " << outlier;
        EXPECT_NEAR(rstd[0], rs, 2 * kU32 * rs) << cols << " " << outlier;
      }
    }
  }
}

TEST_P(NormKernelsTest, PartialStatsMatchFloat64) {
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(IsaName(isa));
    for (int64_t cols : kWidths) {
      const Inputs in(cols, GetParam(), 200 + cols);
      std::vector<double> stats(2 * kRows);
      NormKernelsFor(isa).partial_stats(in.x.data(), kRows, cols, stats.data());
      for (int64_t r = 0; r < kRows; ++r) {
        double sum = 0.0, squares = 0.0, magnitude = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
          const double v = in.x[r * cols + c];
          sum += v;
          squares += v * v;
          magnitude += std::abs(v);
        }
        // Exact products (fp32 squared fits in double); two double sums of cols terms each
        // (the kernel's and the reference's).
        EXPECT_NEAR(stats[2 * r], sum, 2 * cols * kU64 * magnitude) << cols;
        EXPECT_NEAR(stats[2 * r + 1], squares, 2 * cols * kU64 * squares) << cols;
      }
    }
  }
}

// The backward kernels take mean and rstd as given fp32 values: the reference uses the same.
TEST_P(NormKernelsTest, BackwardKernelsMatchFloat64) {
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const NormKernels& k = NormKernelsFor(isa);
    for (int64_t cols : kWidths) {
      const Inputs in(cols, GetParam(), 300 + cols);
      std::vector<float> mean(kRows), rstd(kRows), dx(kRows * cols);
      for (int64_t r = 0; r < kRows; ++r) {
        double mu, rs;
        ReferenceStats(in, r, mu, rs);
        mean[r] = static_cast<float>(mu);
        rstd[r] = static_cast<float>(rs);
      }
      std::vector<double> dx_ref(kRows * cols), dx_tol(kRows * cols);
      // fp32 parameter partials, row by row, added to non-zero starting values: each addition
      // rounds by u of the running sum, bounded by the starting value plus the terms so far.
      std::vector<float> sum_w(cols, 0.5f), sum_b(cols, -0.25f);
      std::vector<double> sum_w_ref(cols, 0.5), sum_b_ref(cols, -0.25), sum_w_tol(cols, 0.0),
          sum_b_tol(cols, 0.0), running_w(cols, 0.5), running_b(cols, 0.25);
      const double l = LaneRoundings(cols);
      for (int64_t r = 0; r < kRows; ++r) {
        const float* x = in.x.data() + r * cols;
        const float* dy = in.dy.data() + r * cols;
        std::vector<double> xhat(cols);
        double sum_g = 0.0, sum_g_xhat = 0.0, mag_g = 0.0, mag_g_xhat = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
          xhat[c] = (double{x[c]} - mean[r]) * rstd[r];
          const double g = double{dy[c]} * in.w[c];
          sum_g += g;
          sum_g_xhat += g * xhat[c];
          mag_g += std::abs(g);
          mag_g_xhat += std::abs(g * xhat[c]);
          sum_w_ref[c] += dy[c] * xhat[c];
          sum_b_ref[c] += dy[c];
          running_w[c] += std::abs(dy[c] * xhat[c]);
          running_b[c] += std::abs(dy[c]);
          // The term: xhat's 2 u and the product's u; the addition: u of the running sum.
          sum_w_tol[c] += 3 * kU32 * std::abs(dy[c] * xhat[c]) + kU32 * running_w[c];
          sum_b_tol[c] += kU32 * running_b[c];
        }
        double sums[2];
        k.backward_row_sums(x, dy, in.w.data(), mean[r], rstd[r], cols, sums);
        // g's rounding and the lane sum; for g * xhat also xhat's 2 u and the product's u.
        EXPECT_NEAR(sums[0], sum_g, (l + 1) * kU32 * mag_g) << cols;
        EXPECT_NEAR(sums[1], sum_g_xhat, (l + 4) * kU32 * mag_g_xhat) << cols;

        // The kernel takes the row means as fp32: the reference uses the same values.
        const float mean_g = static_cast<float>(sum_g / cols);
        const float mean_g_xhat = static_cast<float>(sum_g_xhat / cols);
        k.input_and_param_grad_row(x, dy, in.w.data(), mean[r], rstd[r], mean_g, mean_g_xhat, cols,
                                   dx.data() + r * cols, sum_w.data(), sum_b.data());
        for (int64_t c = 0; c < cols; ++c) {
          const double g = double{dy[c]} * in.w[c];
          const int64_t i = r * cols + c;
          dx_ref[i] = rstd[r] * (g - mean_g - xhat[c] * mean_g_xhat);
          // g's rounding, the two differences', the product's and xhat's 2 u through the
          // product: 3 u |g| + 2 u |mean_g| + 4 u |xhat mean_g_xhat| at most; then the product
          // with rstd: u |dx|.
          dx_tol[i] = 4 * kU32 * rstd[r] *
                          (std::abs(g) + std::abs(mean_g) + std::abs(xhat[c] * mean_g_xhat)) +
                      kU32 * std::abs(dx_ref[i]);
        }
      }
      ExpectWithin(dx, dx_ref, dx_tol, "dx, cols " + std::to_string(cols));

      for (int64_t c = 0; c < cols; ++c) {
        EXPECT_NEAR(sum_w[c], sum_w_ref[c], sum_w_tol[c]) << cols << " " << c;
        EXPECT_NEAR(sum_b[c], sum_b_ref[c], sum_b_tol[c]) << cols << " " << c;
      }
    }
  }
}

}  // namespace
}  // namespace nf::cpu
