// The vectorised softmax-family kernels (core/cpu/isa/softmax_kernels.h) at every ISA level this
// CPU runs, against float64 references written here, on row lengths that exercise the 16-lane
// main loop and its tail (1, 3, 17, 130, 768) and on large, small and masked logits.
//
// Error model. The kernels' exp is within kExpMaxUlps ulp of exp of its fp32 argument, i.e.
// within kExpRel = 2 kExpMaxUlps u32 relative (an ulp is at most 2 u32 of the value), for
// results of at least 2^-126 (smaller ones flush to 0, an absolute error under 2^-126). The
// argument x - shift is one fp32 subtraction: off by at most u32 |x - shift|, which exp turns
// into a relative error of u32 |x - shift|. Each further fp32 operation adds u32 relative.
// Sums are in double (error ~1e-16 relative, far below the fp32 terms' own error).
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/cpu/isa/softmax_kernels.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf::cpu {
namespace {

using ::nf::testing::kU32;
using ::nf::testing::RandomFloats;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kExpRel = 2 * kExpMaxUlps * kU32;
// Below the smallest normal fp32 value the kernels' exp returns 0.
constexpr double kFlushAbs = 0x1p-126;
// The row lengths every kernel runs on: one element, a tail only, one lane group and a tail,
// several groups and a tail, and the 125M model's width.
const std::vector<int64_t> kLengths = {1, 3, 17, 130, 768};

// Expects |actual[i] - expected[i]| <= tol[i] (NaN only where expected is NaN), reporting the
// worst element relative to its tolerance.
void ExpectWithin(const std::vector<double>& actual, const std::vector<double>& expected,
                  const std::vector<double>& tol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(actual[i])) << what << " [" << i << "]";
    } else if (actual[i] != expected[i]) {  // also covers equal infinities
      EXPECT_LE(std::abs(actual[i] - expected[i]), tol[i])
          << what << " [" << i << "]: " << actual[i] << ", expected " << expected[i];
    }
  }
}

std::vector<double> ToDoubles(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// A row of n logits in [-10, 10) with awkward entries: -inf (masked), 80 (the row max, so exp
// of the others underflows to tiny values) and -80, at positions that depend on n.
std::vector<float> AwkwardRow(int64_t n, uint32_t seed) {
  std::vector<float> x = RandomFloats(n, seed, -10.0f, 10.0f);
  if (n >= 3) {
    x[n / 3] = -kInf;
    x[n - 1] = -80.0f;
    x[n / 2] = 80.0f;
  }
  return x;
}

// A row's float64 softmax: p = exp(x - max) / sum, the log-sum-exp, and the fp32 kernel's
// relative error bound for the sum: sum_i e_i (kExpRel + u32 |x_i - max|) / sum_i e_i, the
// exp-weighted mean of the terms' bounds.
struct RefSoftmax {
  std::vector<double> p;
  double lse = 0.0, max = 0.0, sum_rel = 0.0;
};
RefSoftmax ReferenceSoftmax(const std::vector<float>& x) {
  RefSoftmax ref;
  ref.max = -INFINITY;
  for (float v : x) ref.max = std::max<double>(ref.max, v);
  double sum = 0.0, weighted = 0.0;
  for (float v : x) {
    const double e = std::exp(v - ref.max);
    sum += e;
    if (e > 0.0) weighted += e * (kExpRel + kU32 * std::abs(v - ref.max));  // -inf adds 0
  }
  for (float v : x) ref.p.push_back(std::exp(v - ref.max) / sum);
  ref.lse = ref.max + std::log(sum);
  ref.sum_rel = weighted / sum;
  return ref;
}

// ulps between the kernel's exp(x) and exp(x) rounded from double: |got - exact| / ulp(exact).
double UlpError(float got, double exact) {
  const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
  return std::abs(got - exact) / ulp;
}

TEST(SoftmaxKernelsTest, ExpIsWithinItsStatedUlpsOverTheWholeNormalRange) {
  // Every 257th fp32 bit pattern from ln(2^-126) to ln(FLT_MAX) (both signs: ~9M inputs), in
  // one call per level so the vector loops run.
  std::vector<float> x;
  for (uint32_t bits = 0; bits < std::bit_cast<uint32_t>(88.72f); bits += 257) {
    x.push_back(std::bit_cast<float>(bits));
    if (std::bit_cast<float>(bits) < 87.33f) x.push_back(-std::bit_cast<float>(bits));
  }
  std::vector<float> out(x.size());
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(IsaName(isa));
    SoftmaxKernelsFor(isa).exp_shifted(x.data(), x.size(), 0.0f, out.data());
    double worst = 0.0;
    float worst_x = 0.0f;
    for (size_t i = 0; i < x.size(); ++i) {
      const double ulps = UlpError(out[i], std::exp(static_cast<double>(x[i])));
      if (ulps > worst) {
        worst = ulps;
        worst_x = x[i];
      }
    }
    std::printf("%s: exp worst error %.3f ulp at x = %.9g\n", IsaName(isa), worst, worst_x);
    EXPECT_LE(worst, kExpMaxUlps) << "at x = " << worst_x;
  }
}

TEST(SoftmaxKernelsTest, ExpSpecialValues) {
  // 88.7228317 is the largest fp32 x with exp(x) <= FLT_MAX, 88.7228394 the next one up.
  const std::vector<float> x = {0.0f,   -0.0f,   -kInf,       kInf,       std::nanf(""),
                                -87.3f, -88.0f,  -100.f,      88.7f,      88.8f,
                                1e-30f, -1e-30f, 88.7228317f, 88.7228394f};
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(IsaName(isa));
    std::vector<float> y(x.size());
    SoftmaxKernelsFor(isa).exp_shifted(x.data(), x.size(), 0.0f, y.data());
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], 1.0f);
    EXPECT_EQ(y[2], 0.0f);
    EXPECT_EQ(y[3], kInf);
    EXPECT_TRUE(std::isnan(y[4]));
    EXPECT_NEAR(y[5] / std::exp(double{x[5]}), 1.0, kExpRel);  // just above the smallest normal
    EXPECT_EQ(y[6], 0.0f);                                     // would be subnormal: flushed
    EXPECT_EQ(y[7], 0.0f);
    EXPECT_NEAR(y[8] / std::exp(double{x[8]}), 1.0,
                kExpRel);  // n = 128: the split 2^n stays finite
    EXPECT_EQ(y[9], kInf);
    EXPECT_EQ(y[10], 1.0f);
    EXPECT_EQ(y[11], 1.0f);
    EXPECT_NEAR(y[12] / std::exp(double{x[12]}), 1.0, kExpRel);
    EXPECT_EQ(y[13], kInf);
  }
}

TEST(SoftmaxKernelsTest, MaxSkipsMaskedAndNanEntries) {
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const SoftmaxKernels& k = SoftmaxKernelsFor(isa);
    for (int64_t n : kLengths) {
      std::vector<float> x = AwkwardRow(n, 3 + n);
      double expected = -INFINITY;
      for (float v : x) expected = std::max<double>(expected, v);
      EXPECT_EQ(k.max(x.data(), n), expected) << n;
      if (n > 1) {  // x[0] is not the max for n > 1
        x[0] = std::nanf("");
        EXPECT_EQ(k.max(x.data(), n), expected) << n;
      }
    }
    const std::vector<float> masked(19, -kInf);
    EXPECT_EQ(k.max(masked.data(), masked.size()), -kInf);
    EXPECT_EQ(k.max(masked.data(), 0), -kInf);
  }
}

TEST(SoftmaxKernelsTest, SoftmaxMatchesFloat64) {
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const SoftmaxKernels& k = SoftmaxKernelsFor(isa);
    for (int64_t n : kLengths) {
      const std::vector<float> x = AwkwardRow(n, 10 + n);
      const RefSoftmax ref = ReferenceSoftmax(x);
      std::vector<float> y(n);
      const float lse = k.softmax(x.data(), n, y.data());
      // p_i = e_i * fp32(1 / sum): e_i's exp and argument errors, the sum's weighted bound,
      // and two more fp32 roundings (1 / sum, the product); flushed terms are under 2^-126.
      std::vector<double> tol(n);
      for (int64_t i = 0; i < n; ++i) {
        const double arg = x[i] == -kInf ? 0.0 : std::abs(x[i] - ref.max);
        tol[i] = ref.p[i] * (kExpRel + kU32 * arg + ref.sum_rel + 2 * kU32) + kFlushAbs;
      }
      ExpectWithin(ToDoubles(y), ref.p, tol, "softmax n=" + std::to_string(n));
      // lse = max + fp32(log(sum)), then the fp32 sum: the sum's relative error is log's
      // absolute error; two roundings of values up to |max| + |log(sum)|.
      EXPECT_NEAR(lse, ref.lse, ref.sum_rel + 2 * kU32 * (std::abs(ref.max) + std::abs(ref.lse)))
          << n;
      // In place gives the same bits.
      std::vector<float> in_place = x;
      EXPECT_EQ(k.softmax(in_place.data(), n, in_place.data()), lse);
      EXPECT_EQ(in_place, y) << n;
    }
  }
}

TEST(SoftmaxKernelsTest, FullyMaskedRowGetsZeros) {
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const std::vector<float> x(17, -kInf);
    std::vector<float> y(17, 5.0f);
    EXPECT_EQ(SoftmaxKernelsFor(isa).softmax(x.data(), 17, y.data()), -kInf);
    EXPECT_EQ(y, std::vector<float>(17, 0.0f));
  }
}

TEST(SoftmaxKernelsTest, SumExpAndScaledExpMatchFloat64) {
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const SoftmaxKernels& k = SoftmaxKernelsFor(isa);
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{130}, int64_t{768},
                      int64_t{3000}}) {  // 3000: several of sum_exp's stack blocks
      const std::vector<float> x = AwkwardRow(n, 20 + n);
      const RefSoftmax ref = ReferenceSoftmax(x);
      const float shift = static_cast<float>(ref.max);
      double sum_ref = 0.0;
      for (float v : x) sum_ref += std::exp(v - ref.max);
      // The sum's weighted bound, plus one 2^-126 per flushed term at most.
      EXPECT_NEAR(k.sum_exp_shifted(x.data(), n, shift), sum_ref,
                  sum_ref * ref.sum_rel + n * kFlushAbs)
          << n;
      const float scale = 0.37f;
      std::vector<float> out(n);
      k.scaled_exp_shifted(x.data(), n, shift, scale, out.data());
      std::vector<double> expected(n), tol(n);
      for (int64_t i = 0; i < n; ++i) {
        expected[i] = scale * std::exp(x[i] - ref.max);
        const double arg = x[i] == -kInf ? 0.0 : std::abs(x[i] - ref.max);
        tol[i] = expected[i] * (kExpRel + kU32 * arg + kU32) + kFlushAbs;
      }
      ExpectWithin(ToDoubles(out), expected, tol, "scaled exp n=" + std::to_string(n));
    }
  }
}

TEST(SoftmaxKernelsTest, DotAndSoftmaxGradMatchFloat64) {
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const SoftmaxKernels& k = SoftmaxKernelsFor(isa);
    for (int64_t n : kLengths) {
      const std::vector<float> a = RandomFloats(n, 30 + n, -3.0f, 3.0f);
      const std::vector<float> b = RandomFloats(n, 31 + n, -3.0f, 3.0f);
      double dot_ref = 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        dot_ref += double{a[i]} * b[i];
        magnitude += std::abs(double{a[i]} * b[i]);
      }
      // fp32 products are exact in double; n double additions: n 2^-53 of the magnitudes.
      EXPECT_NEAR(k.dot(a.data(), b.data(), n), dot_ref, n * 0x1p-53 * magnitude) << n;
      // out = p (g - row_dot): two fp32 roundings of values up to |p| (|g| + |row_dot|).
      const float row_dot = 0.625f;
      std::vector<float> out(n);
      k.softmax_grad(a.data(), b.data(), n, row_dot, out.data());
      std::vector<double> expected(n), tol(n);
      for (int64_t i = 0; i < n; ++i) {
        expected[i] = double{a[i]} * (double{b[i]} - row_dot);
        tol[i] = 2 * kU32 * std::abs(a[i]) * (std::abs(b[i]) + row_dot);
      }
      ExpectWithin(ToDoubles(out), expected, tol, "softmax grad n=" + std::to_string(n));
    }
  }
}

}  // namespace
}  // namespace nf::cpu
