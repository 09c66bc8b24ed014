// The vectorised elementwise kernels (core/cpu/isa/elementwise_kernels.h) at every ISA level this
// CPU runs: the activations against float64 references written here over a dense grid and
// special values, dropout against the scalar Philox of core/philox.h bit for bit, the scaling
// and BLAS-1 kernels against their one-rounding definitions, and every kernel's vector body
// against its scalar remainder (an element's bits may not depend on where a chunk starts, which
// is what keeps results independent of the thread count).
//
// Error model. u32 = 2^-24 is fp32's unit roundoff; an ulp of a value v is the fp32 spacing at
// |v| (at most 2 u32 |v|; 2^-149 below the normal range). The exact GELU's Phi(x) is
// t R(t) exp(-x^2/2) (or 1 minus it), whose parts were measured against these references over
// a 2^-16 grid of [-14, 8]: the exp <= 1.4 ulp, t R(t) <= 3.4 ulp (a 2.3e-8 fit plus the
// rounding of a dozen fp32 operations), Phi <= 5.5 ulp for x <= 0 and <= 3 u32 absolute for
// x > 0, x Phi(x) <= 5.9 ulp, its derivative <= 3.2 u32 absolute (dy = 1). The tolerances
// below leave a margin over those maxima but are far below what a wrong formula gives (the tanh
// GELU differs from the exact one by up to 4.7e-4).
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cpu/isa/elementwise_kernels.h"
#include "core/philox.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf::cpu {
namespace {

using ::nf::testing::kU32;
using ::nf::testing::RandomFloats;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The fp32 spacing at |v|.
double Ulp(double v) {
  const float f = std::abs(static_cast<float>(v));
  if (f < std::numeric_limits<float>::min()) return 0x1p-149;
  return std::nextafter(f, kInf) - f;
}

// [-16, 16] in steps of 2^-9 (both signs of every step, 0 included), then values that are tiny,
// subnormal or large: the range where the exp underflows and where Phi rounds to 0 or 1.
std::vector<float> ActivationInputs() {
  std::vector<float> x;
  for (int i = -16 * 512; i <= 16 * 512; ++i) x.push_back(static_cast<float>(i) / 512);
  for (float v : {1e-30f, 1e-20f, 1e-6f, 3e-39f, 1e-44f, 17.5f, 30.0f, 100.0f, 1e10f}) {
    x.push_back(v);
    x.push_back(-v);
  }
  x.push_back(-0.0f);
  return x;
}

// Normal CDF and density in double.
double Phi(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }
double NormalPdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi); }

// Expects |actual - expected| <= tolerance, NaN only where expected is NaN.
void ExpectNear(float actual, double expected, double tolerance, const std::string& what) {
  if (std::isnan(expected)) {
    EXPECT_TRUE(std::isnan(actual)) << what << ": " << actual << ", expected NaN";
  } else if (actual != expected) {
    EXPECT_LE(std::abs(actual - expected), tolerance)
        << what << ": " << actual << ", expected " << expected;
  }
}

// Bitwise equality (NaN payloads included) of two float arrays.
void ExpectSameBits(const std::vector<float>& actual, const std::vector<float>& expected,
                    const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(actual[i]), std::bit_cast<uint32_t>(expected[i]))
        << what << " [" << i << "]: " << actual[i] << ", expected " << expected[i];
  }
}

std::string Where(Isa isa, float x) { return absl::StrCat(IsaName(isa), " x=", x); }

// ---- Exact GELU --------------------------------------------------------------------------------

TEST(IsaGeluTest, ForwardWithinEightUlpOfFloat64) {
  const std::vector<float> x = ActivationInputs();
  std::vector<float> y(x.size());
  for (Isa isa : RunnableIsas()) {
    ElementwiseKernelsFor(isa).gelu.forward(x.data(), y.data(), std::ssize(x));
    for (size_t i = 0; i < x.size(); ++i) {
      const double expected = x[i] * Phi(x[i]);
      // 8 ulp (measured 5.9); below 2^-126 the exp is subnormal and exact only to 2^-149,
      // which |x| <= 16 and t R(t) <= 1 scale to at most 2^-145.
      ExpectNear(y[i], expected, 8 * Ulp(expected) + 0x1p-145, Where(isa, x[i]));
    }
  }
}

TEST(IsaGeluTest, BackwardWithinFourU32OfFloat64) {
  const std::vector<float> x = ActivationInputs();
  const std::vector<float> dy = RandomFloats(x.size(), 7, -2.0f, 2.0f);
  std::vector<float> dx(x.size());
  for (Isa isa : RunnableIsas()) {
    ElementwiseKernelsFor(isa).gelu.backward(x.data(), dy.data(), dx.data(), std::ssize(x));
    for (size_t i = 0; i < x.size(); ++i) {
      const double derivative = Phi(x[i]) + x[i] * NormalPdf(x[i]);
      const double expected = dy[i] * derivative;
      // Phi within 3 u32 absolute (x > 0; 5.5 ulp <= 2.75 u32 below), x phi(x) <= 0.25 within
      // a few ulp, their sum one more rounding: 4 u32 (measured 3.2), times |dy|, plus the
      // product's own half ulp.
      ExpectNear(dx[i], expected, 4 * kU32 * std::abs(dy[i]) + Ulp(expected), Where(isa, x[i]));
    }
  }
}

TEST(IsaGeluTest, SpecialValues) {
  // NaN propagates, +inf passes through, -inf is NaN (-inf * 0, as x * Phi(x) was before), the
  // saturated ends are x and 0 exactly, and the sign of zero is kept.
  const std::vector<float> x = {kNaN, kInf, -kInf, 30.0f, -30.0f, 0.0f, -0.0f};
  const std::vector<float> ones(x.size(), 1.0f);
  std::vector<float> y(x.size()), dx(x.size());
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const ElementwiseKernels& kernels = ElementwiseKernelsFor(isa);
    kernels.gelu.forward(x.data(), y.data(), std::ssize(x));
    EXPECT_TRUE(std::isnan(y[0]));
    EXPECT_EQ(y[1], kInf);
    EXPECT_TRUE(std::isnan(y[2]));
    EXPECT_EQ(y[3], 30.0f);
    EXPECT_EQ(y[4], 0.0f);
    EXPECT_EQ(std::bit_cast<uint32_t>(y[5]), 0u);
    EXPECT_EQ(std::bit_cast<uint32_t>(y[6]), 0x80000000u);
    kernels.gelu.backward(x.data(), ones.data(), dx.data(), std::ssize(x));
    // inf * phi(inf) = inf * 0 is NaN at both infinities, as before.
    EXPECT_TRUE(std::isnan(dx[0]) && std::isnan(dx[1]) && std::isnan(dx[2]));
    EXPECT_EQ(dx[3], 1.0f);
    EXPECT_EQ(dx[4], 0.0f);
    EXPECT_NEAR(dx[5], 0.5f, 2 * kU32);
  }
}

// ---- Tanh GELU ---------------------------------------------------------------------------------

// The kernel's inner argument u = sqrt(2/pi) (x + 0.044715 x^3) is rounded in fp32 as before
// (five operations on same-sign terms: <= 5 u32 |u| off); the tolerances carry that error
// through the derivative of the output in u. The sigmoid form adds the exp (<= 2 ulp) and four
// more roundings, so 8 ulp of the output on top. Where q = exp(-2|u|) is subnormal (x < -10)
// it is exact only to 2^-149, an absolute error that sigmoid(2u) inherits and the outputs
// multiply by at most |x| (forward) or (1 + 2 |x| u'(x)) |dy| (backward): kSubnormal of that.
constexpr double kCubic = 0.044715;
const double kSqrt2OverPi = std::sqrt(2.0 / std::numbers::pi);

constexpr double kSubnormal = 0x1p-148;

double Inner(double x) { return kSqrt2OverPi * (x + kCubic * x * x * x); }
// (1 + tanh u) / 2 = sigmoid(2u) and 1 minus it, each without cancellation (in double, 1 + tanh u
// would be 0 for u < -19 and the reference useless in the left tail).
double Sigmoid2(double u) { return 1 / (1 + std::exp(-2 * u)); }
double OneMinusSigmoid2(double u) { return 1 / (1 + std::exp(2 * u)); }

TEST(IsaGeluTanhTest, ForwardWithinRoundingOfTheInnerArgument) {
  const std::vector<float> x = ActivationInputs();
  std::vector<float> y(x.size());
  for (Isa isa : RunnableIsas()) {
    ElementwiseKernelsFor(isa).gelu_tanh.forward(x.data(), y.data(), std::ssize(x));
    for (size_t i = 0; i < x.size(); ++i) {
      const double u = Inner(x[i]), s = Sigmoid2(u), one_minus_s = OneMinusSigmoid2(u);
      const double expected = x[i] * s;
      // d(x s)/du = 2 x s (1 - s).
      const double from_u = 2 * std::abs(x[i]) * s * one_minus_s * 5 * kU32 * std::abs(u);
      const double subnormal = kSubnormal * std::abs(x[i]);
      ExpectNear(y[i], expected, 8 * Ulp(expected) + from_u + subnormal, Where(isa, x[i]));
    }
  }
}

TEST(IsaGeluTanhTest, BackwardWithinRoundingOfTheInnerArgument) {
  const std::vector<float> x = ActivationInputs();
  const std::vector<float> dy = RandomFloats(x.size(), 8, -2.0f, 2.0f);
  std::vector<float> dx(x.size());
  for (Isa isa : RunnableIsas()) {
    ElementwiseKernelsFor(isa).gelu_tanh.backward(x.data(), dy.data(), dx.data(), std::ssize(x));
    for (size_t i = 0; i < x.size(); ++i) {
      const double v = x[i], u = Inner(v), s = Sigmoid2(u), s_1_s = s * OneMinusSigmoid2(u);
      const double dinner = kSqrt2OverPi * (1 + 3 * kCubic * v * v);
      const double slope = 2 * std::abs(v) * s_1_s * dinner;  // the second term's size
      const double expected = dy[i] * (s + 2 * v * s_1_s * dinner);
      // Evaluation: 8 u32 of each term's size; u's error moves s by 2 s (1 - s) du, and the
      // second term by up to 2 |x| dinner times that.
      const double from_u = 2 * s_1_s * (1 + 2 * std::abs(v) * dinner) * 5 * kU32 * std::abs(u);
      const double subnormal = kSubnormal * (1 + 2 * std::abs(v) * dinner);
      const double tolerance = std::abs(dy[i]) * (8 * kU32 * (s + slope) + from_u + subnormal);
      ExpectNear(dx[i], expected, tolerance + Ulp(expected), Where(isa, x[i]));
    }
  }
}

TEST(IsaGeluTanhTest, SpecialValues) {
  // As with 0.5 x (1 + tanh u) before: beyond |x| ~ 1e19 the fp32 u'(x) overflows and the
  // backward is inf * 0 = NaN while the forward still saturates.
  const std::vector<float> x = {kNaN, kInf, -kInf, 30.0f, -30.0f, 1e30f};
  const std::vector<float> ones(x.size(), 1.0f);
  std::vector<float> y(x.size()), dx(x.size());
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const ElementwiseKernels& kernels = ElementwiseKernelsFor(isa);
    kernels.gelu_tanh.forward(x.data(), y.data(), std::ssize(x));
    EXPECT_TRUE(std::isnan(y[0]));
    EXPECT_EQ(y[1], kInf);
    EXPECT_TRUE(std::isnan(y[2]));  // -inf * 0, as 0.5 x (1 + tanh u) was
    EXPECT_EQ(y[3], 30.0f);
    EXPECT_EQ(y[4], 0.0f);
    EXPECT_EQ(y[5], 1e30f);
    kernels.gelu_tanh.backward(x.data(), ones.data(), dx.data(), std::ssize(x));
    EXPECT_TRUE(std::isnan(dx[0]) && std::isnan(dx[1]) && std::isnan(dx[2]));
    EXPECT_EQ(dx[3], 1.0f);
    EXPECT_EQ(dx[4], 0.0f);
    EXPECT_TRUE(std::isnan(dx[5]));
  }
}

// ---- ReLU^2: the scalar formula's bits ---------------------------------------------------------

TEST(IsaReluSquaredTest, BitsOfTheScalarFormula) {
  std::vector<float> x = ActivationInputs();
  x.insert(x.end(), {kNaN, kInf, -kInf, 1e20f});
  const std::vector<float> dy = RandomFloats(x.size(), 9, -2.0f, 2.0f);
  std::vector<float> y(x.size()), dx(x.size()), y_ref(x.size()), dx_ref(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    y_ref[i] = x[i] > 0.0f ? x[i] * x[i] : 0.0f;
    dx_ref[i] = dy[i] * (x[i] > 0.0f ? 2.0f * x[i] : 0.0f);
  }
  for (Isa isa : RunnableIsas()) {
    const ElementwiseKernels& kernels = ElementwiseKernelsFor(isa);
    kernels.relu_squared.forward(x.data(), y.data(), std::ssize(x));
    kernels.relu_squared.backward(x.data(), dy.data(), dx.data(), std::ssize(x));
    ExpectSameBits(y, y_ref, absl::StrCat(IsaName(isa), " forward"));
    ExpectSameBits(dx, dx_ref, absl::StrCat(IsaName(isa), " backward"));
  }
}

// ---- Vector body and scalar remainder agree ----------------------------------------------------

// Every elementwise kernel over n elements at once, and again one element per call (all of it
// scalar remainder, no vector body), must give the same bits; so must in-place calls.
TEST(IsaElementwiseTest, VectorBodyAndRemainderGiveTheSameBits) {
  std::vector<float> x = RandomFloats(1000, 10, -8.0f, 8.0f);
  x[5] = kNaN;
  x[6] = -0.0f;
  x[7] = 20.0f;
  const std::vector<float> dy = RandomFloats(x.size(), 11, -2.0f, 2.0f);
  const int64_t n = std::ssize(x);
  for (Isa isa : RunnableIsas()) {
    const ElementwiseKernels& kernels = ElementwiseKernelsFor(isa);
    for (const auto& [name, activation] :
         {std::pair{"gelu", kernels.gelu}, std::pair{"gelu_tanh", kernels.gelu_tanh},
          std::pair{"relu_squared", kernels.relu_squared}}) {
      const std::string what = absl::StrCat(IsaName(isa), " ", name);
      std::vector<float> whole(n), single(n), in_place = x;
      activation.forward(x.data(), whole.data(), n);
      for (int64_t i = 0; i < n; ++i) activation.forward(x.data() + i, single.data() + i, 1);
      activation.forward(in_place.data(), in_place.data(), n);
      ExpectSameBits(single, whole, what + " forward, one element per call");
      ExpectSameBits(in_place, whole, what + " forward in place");
      in_place = dy;
      activation.backward(x.data(), dy.data(), whole.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        activation.backward(x.data() + i, dy.data() + i, single.data() + i, 1);
      }
      activation.backward(x.data(), in_place.data(), in_place.data(), n);
      ExpectSameBits(single, whole, what + " backward, one element per call");
      ExpectSameBits(in_place, whole, what + " backward in place");
    }
    std::vector<float> whole = dy, single = dy;
    kernels.axpy(0.3f, x.data(), whole.data(), n);
    for (int64_t i = 0; i < n; ++i) kernels.axpy(0.3f, x.data() + i, single.data() + i, 1);
    ExpectSameBits(single, whole, absl::StrCat(IsaName(isa), " axpy"));
  }
}

// value_and_derivative is forward's value and backward's multiplier: y has forward's bits, and
// dy * dydx has backward's, for dy of every sign and size (the multiplier is one fp32 value,
// not an expression backward could round differently). Also one element per call.
TEST(IsaElementwiseTest, ValueAndDerivativeGiveForwardAndBackwardBits) {
  std::vector<float> x = ActivationInputs();
  x.push_back(kNaN);
  x.push_back(kInf);
  x.push_back(-kInf);
  const std::vector<float> dy = RandomFloats(x.size(), 12, -3.0f, 3.0f);
  const int64_t n = std::ssize(x);
  for (Isa isa : RunnableIsas()) {
    const ElementwiseKernels& kernels = ElementwiseKernelsFor(isa);
    for (const auto& [name, activation] :
         {std::pair{"gelu", kernels.gelu}, std::pair{"gelu_tanh", kernels.gelu_tanh},
          std::pair{"relu_squared", kernels.relu_squared}}) {
      const std::string what = absl::StrCat(IsaName(isa), " ", name);
      std::vector<float> y(n), dx(n), value(n), slope(n), value_single(n), slope_single(n);
      activation.forward(x.data(), y.data(), n);
      activation.backward(x.data(), dy.data(), dx.data(), n);
      activation.value_and_derivative(x.data(), value.data(), slope.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        activation.value_and_derivative(x.data() + i, value_single.data() + i,
                                        slope_single.data() + i, 1);
      }
      std::vector<float> dx_from_slope(n);
      for (int64_t i = 0; i < n; ++i) dx_from_slope[i] = dy[i] * slope[i];
      ExpectSameBits(value, y, what + " value vs forward");
      ExpectSameBits(dx_from_slope, dx, what + " dy * derivative vs backward");
      ExpectSameBits(value_single, value, what + " value, one element per call");
      ExpectSameBits(slope_single, slope, what + " derivative, one element per call");
    }
  }
}

// ---- Dropout: the scalar Philox's mask, bit for bit --------------------------------------------

// What the scalar code computes for element c: DropoutWords' word (first_col + c) & 3 of the
// group (first_col + c) / 4, keep -> x * keep_scale in fp32, drop -> +0.
std::vector<float> ReferenceDropout(const DropoutRowArgs& a, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t c = 0; c < x.size(); ++c) {
    const uint64_t col = a.first_col + c;
    const PhiloxCounter words = DropoutWords(a.seed, a.site, a.sample, a.head, a.row, col);
    y[c] = words[col & 3] >= a.threshold ? x[c] * a.keep_scale : 0.0f;
  }
  return y;
}

TEST(IsaDropoutTest, MaskAndValuesEqualTheScalarPhilox) {
  // Column offsets on and off the 4-column groups and the 64-column blocks, one beyond 2^32
  // groups (the counter keeps col / 4's low 32 bits), and coordinates beyond 32 bits likewise.
  const uint64_t offsets[] = {0, 1, 2, 3, 5, 7, 61, 64, 130, (uint64_t{1} << 34) + 3};
  const int64_t lengths[] = {1, 3, 17, 64, 65, 130, 200};
  const uint32_t thresholds[] = {DropoutThreshold(0.1f), DropoutThreshold(0.5f),
                                 DropoutThreshold(0.9f), 0u, 0xFFFFFFFFu};
  for (Isa isa : RunnableIsas()) {
    for (uint64_t first_col : offsets) {
      for (int64_t n : lengths) {
        for (uint32_t threshold : thresholds) {
          const DropoutRowArgs args{.seed = 1234,
                                    .site = 17,
                                    .sample = (uint64_t{1} << 32) + 9,
                                    .head = 3,
                                    .row = 77 + static_cast<uint64_t>(n),
                                    .first_col = first_col,
                                    .threshold = threshold,
                                    .keep_scale = 1.0f / 0.9f};
          std::vector<float> x = RandomFloats(n, static_cast<uint32_t>(n + first_col), -3, 3);
          // NaN, infinities and -0 are dropped to +0 or scaled like any value.
          for (int64_t c = 0; c < n; c += 5) x[c] = c % 4 == 0 ? kNaN : c % 3 ? -0.0f : -kInf;
          const std::string what = absl::StrCat(IsaName(isa), " first_col=", first_col, " n=", n,
                                                " threshold=", threshold);
          const std::vector<float> expected = ReferenceDropout(args, x);
          std::vector<float> y(n);
          ElementwiseKernelsFor(isa).dropout_row(args, x.data(), y.data(), n);
          ExpectSameBits(y, expected, what);
          // The same mask again from the multipliers of a row of ones.
          std::vector<float> multipliers(n, 1.0f), again(n);
          ElementwiseKernelsFor(isa).dropout_row(args, multipliers.data(), multipliers.data(), n);
          ElementwiseKernelsFor(isa).apply_dropout_multipliers(multipliers.data(), x.data(),
                                                               again.data(), n);
          ExpectSameBits(again, expected, what + " from the multipliers");
          ElementwiseKernelsFor(isa).dropout_row(args, x.data(), x.data(), n);
          ExpectSameBits(x, expected, what + " in place");
        }
      }
    }
  }
}

// ---- Scaling, column sums, axpy ----------------------------------------------------------------

TEST(IsaScaleTest, OneProductPerElement) {
  for (Isa isa : RunnableIsas()) {
    const ElementwiseKernels& kernels = ElementwiseKernelsFor(isa);
    for (int64_t cols : {1, 3, 17, 130}) {
      const int64_t rows = 3;
      const std::vector<float> x = RandomFloats(rows * cols, 20, -4, 4);
      const std::vector<float> scale = RandomFloats(cols, 21, 0.5f, 1.5f);
      std::vector<float> y(x.size()), expected(x.size());
      for (int64_t i = 0; i < rows * cols; ++i) expected[i] = x[i] * scale[i % cols];
      kernels.scale_columns(x.data(), scale.data(), y.data(), rows, cols);
      ExpectSameBits(y, expected, absl::StrCat(IsaName(isa), " scale_columns cols=", cols));
      for (int64_t i = 0; i < rows * cols; ++i) expected[i] = 0.75f * x[i];
      kernels.scale(x.data(), 0.75f, y.data(), rows * cols);
      ExpectSameBits(y, expected, absl::StrCat(IsaName(isa), " scale n=", rows * cols));
    }
  }
}

TEST(IsaSumRowsProductTest, ColumnSumsInRowOrder) {
  // Each product of two fp32 values is exact in double, and each column adds its rows in
  // order, so the sums are the scalar loop's bits.
  for (Isa isa : RunnableIsas()) {
    for (int64_t rows : {1, 3, 17}) {
      for (int64_t cols : {1, 3, 17, 64}) {
        const int64_t stride = cols + 5;
        const std::vector<float> a = RandomFloats(rows * stride, 30, -4, 4);
        const std::vector<float> b = RandomFloats(rows * stride, 31, -4, 4);
        std::vector<double> sums(cols, 0.25), expected(cols, 0.25);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            expected[c] += static_cast<double>(a[r * stride + c]) * b[r * stride + c];
          }
        }
        ElementwiseKernelsFor(isa).sum_rows_product(a.data(), b.data(), rows, cols, stride,
                                                    sums.data());
        EXPECT_EQ(sums, expected) << IsaName(isa) << " rows=" << rows << " cols=" << cols;
      }
    }
  }
}

TEST(IsaAxpyTest, WithinOneRoundingOfEachOperation) {
  const int64_t n = 131;
  const std::vector<float> x = RandomFloats(n, 40, -4, 4), y0 = RandomFloats(n, 41, -4, 4);
  for (Isa isa : RunnableIsas()) {
    std::vector<float> y = y0;
    ElementwiseKernelsFor(isa).axpy(-0.7f, x.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      // Fused or not: the product's rounding (u32 |a x|) and the sum's (u32 |y|).
      const double product = -0.7f * static_cast<double>(x[i]);
      const double expected = y0[i] + product;
      ExpectNear(y[i], expected, kU32 * (std::abs(product) + std::abs(expected)), Where(isa, x[i]));
    }
  }
}

}  // namespace
}  // namespace nf::cpu
