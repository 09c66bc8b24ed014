// Elementwise ops of ops.h against float64 references written here: AddBias, BiasBackward,
// the three activations (forward vs the double formula, backward vs central finite differences
// of it), Dropout (values, keep rate, the Philox coordinate contract and its layout
// independence), Cast, Fill, Scale and Axpy.
//
// Tolerances follow one pattern. The reference sees the inputs as rounded to their dtype (what
// the kernel reads). The kernel computes in fp32 (unit roundoff u = 2^-24), so an fp32 result
// carries a few u; an fp16 / bf16 result is then rounded once more, adding half an ulp:
// 2^-11 (fp16) or 2^-8 (bf16) relative, plus 2^-25 absolute in fp16's subnormal range.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "core/philox.h"
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
using ::nf::testing::NumericGradient;
using ::nf::testing::RandomFloats;
using ::nf::testing::Rounded;
using ::nf::testing::ToDoubles;

constexpr DType kFloatDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// Half an ulp of an fp16 / bf16 result, relative; 0 for fp32 (covered by each test's fp32 term).
double HalfUlp(DType dtype) {
  return dtype == DType::kF16 ? 0x1p-11 : dtype == DType::kBF16 ? 0x1p-8 : 0.0;
}
// Half the spacing of fp16 subnormals (2^-24), the absolute rounding error near zero.
double SubnormalHalfStep(DType dtype) { return dtype == DType::kF16 ? 0x1p-25 : 0.0; }

// Bitwise equality of two tensors' values (NaN equal to NaN, -0 distinct from +0).
void ExpectSameValues(const Tensor& actual, const Tensor& expected, const std::string& what) {
  const std::vector<double> a = ToDoubles(actual), e = ToDoubles(expected);
  ASSERT_EQ(a.size(), e.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(e[i])) {
      ASSERT_TRUE(std::isnan(a[i])) << what << ": element " << i << " is " << a[i];
    } else {
      ASSERT_EQ(a[i], e[i]) << what << ": element " << i;
      ASSERT_EQ(std::signbit(a[i]), std::signbit(e[i])) << what << ": sign of element " << i;
    }
  }
}

// ---- AddBias / BiasBackward --------------------------------------------------------------------

TEST(AddBiasTest, AddsBiasToEveryRow) {
  uint32_t seed = 1;
  for (DType x_dtype : kFloatDTypes) {
    for (DType b_dtype : kFloatDTypes) {
      SCOPED_TRACE(absl::StrCat("x ", DTypeName(x_dtype), ", bias ", DTypeName(b_dtype)));
      const Shape shape = {2, 3, 17};  // rows = 6 over a leading batch dimension
      const std::vector<float> x = RandomFloats(6 * 17, ++seed, -4.0f, 4.0f);
      const std::vector<float> bias = RandomFloats(17, ++seed);
      const Tensor tx = MakeTensor(x_dtype, shape, x);
      NF_ASSERT_OK(ops::AddBias(tx, MakeTensor(b_dtype, {17}, bias)));
      const std::vector<double> rx = Rounded(x_dtype, x), rb = Rounded(b_dtype, bias);
      std::vector<double> expected(rx.size());
      for (size_t i = 0; i < rx.size(); ++i) expected[i] = rx[i] + rb[i % 17];
      // One fp32 addition (u relative) then the output rounding (half ulp, relative to the
      // rounded sum: <= (half ulp)(1 + u)), plus fp16's subnormal step: 2u + half ulp covers it.
      ExpectAllClose(ToDoubles(tx), expected, SubnormalHalfStep(x_dtype),
                     2 * kU32 + HalfUlp(x_dtype), "x + bias");
    }
  }
}

TEST(AddBiasTest, EdgeShapes) {
  // One row, one column, a 1-D x (one row), and empty tensors.
  const Tensor one = MakeTensor(DType::kF32, {1, 1}, {1.5f});
  NF_ASSERT_OK(ops::AddBias(one, MakeTensor(DType::kF16, {1}, {0.25f})));
  EXPECT_EQ(ToDoubles(one), std::vector<double>{1.75});  // exact in fp32
  const Tensor vec = MakeTensor(DType::kBF16, {3}, {1, 2, 3});
  NF_ASSERT_OK(ops::AddBias(vec, MakeTensor(DType::kF32, {3}, {10, 20, 30})));
  EXPECT_EQ(ToDoubles(vec), (std::vector<double>{11, 22, 33}));  // exact in bf16
  NF_EXPECT_OK(ops::AddBias(MakeZeros(DType::kF32, {0, 4}), MakeZeros(DType::kF32, {4})));
  NF_EXPECT_OK(ops::AddBias(MakeZeros(DType::kF16, {4, 0}), MakeZeros(DType::kF16, {0})));
}

TEST(AddBiasTest, RejectsBadArguments) {
  const Tensor x = MakeZeros(DType::kF32, {3, 5});
  ExpectInvalidArgument(ops::AddBias(x, MakeZeros(DType::kF32, {3})), "AddBias",
                        "bias is f32[3] on cpu, expected shape [5]");
  ExpectInvalidArgument(ops::AddBias(x, MakeZeros(DType::kF32, {1, 5})), "AddBias",
                        "expected shape [5]");
  ExpectInvalidArgument(ops::AddBias(x, MakeZeros(DType::kI32, {5})), "AddBias", "bias is i32[5]");
  ExpectInvalidArgument(ops::AddBias(MakeZeros(DType::kI64, {3, 5}), MakeZeros(DType::kF32, {5})),
                        "AddBias", "x is i64[3, 5]");
  ExpectInvalidArgument(ops::AddBias(x, Tensor()), "AddBias", "bias is missing");
}

TEST(BiasBackwardTest, AccumulatesColumnSumsInFp32) {
  uint32_t seed = 20;
  for (DType dtype : kFloatDTypes) {
    for (int64_t rows : {1, 3, 257}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " rows=", rows));
      const int64_t cols = 7;
      const std::vector<float> dy = RandomFloats(rows * cols, ++seed);
      const std::vector<float> start = RandomFloats(cols, ++seed, -3.0f, 3.0f);
      const Tensor dbias = MakeTensor(DType::kF32, {cols}, start);
      const Tensor tdy = MakeTensor(dtype, {rows, cols}, dy);
      // Twice: the second call must add to the first (gradient accumulation).
      NF_ASSERT_OK(ops::BiasBackward(tdy, dbias));
      NF_ASSERT_OK(ops::BiasBackward(tdy, dbias));
      const std::vector<double> rdy = Rounded(dtype, dy);
      const std::vector<double> actual = ToDoubles(dbias);
      for (int64_t c = 0; c < cols; ++c) {
        double sum = 0.0, magnitude = 0.0;
        for (int64_t r = 0; r < rows; ++r) {
          sum += rdy[r * cols + c];
          magnitude += std::abs(rdy[r * cols + c]);
        }
        // Each call sums in at least fp32 and adds into fp32: a sum of `rows` terms has error
        // <= rows u (sum of magnitudes), and each of the 2 additions into dbias u more.
        const double tolerance = (2 * rows + 4) * kU32 * (std::abs(start[c]) + 2 * magnitude);
        EXPECT_NEAR(actual[c], start[c] + 2 * sum, tolerance) << "column " << c;
      }
    }
  }
}

TEST(BiasBackwardTest, EmptyAndBadArguments) {
  const Tensor dbias = MakeTensor(DType::kF32, {3}, {1, 2, 3});
  NF_ASSERT_OK(ops::BiasBackward(MakeZeros(DType::kBF16, {0, 3}), dbias));
  EXPECT_EQ(ToDoubles(dbias), (std::vector<double>{1, 2, 3}));  // nothing added
  ExpectInvalidArgument(
      ops::BiasBackward(MakeZeros(DType::kF16, {2, 3}), MakeZeros(DType::kF16, {3})),
      "BiasBackward", "dbias is f16[3] on cpu, expected dtype f32");
  ExpectInvalidArgument(
      ops::BiasBackward(MakeZeros(DType::kF32, {2, 3}), MakeZeros(DType::kF32, {2})),
      "BiasBackward", "expected shape [3]");
  ExpectInvalidArgument(ops::BiasBackward(MakeZeros(DType::kI32, {2, 3}), dbias), "BiasBackward",
                        "dy is i32[2, 3]");
}

// ---- Activations -------------------------------------------------------------------------------

double ReferenceActivation(ops::Activation act, double x) {
  switch (act) {
    case ops::Activation::kGelu:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case ops::Activation::kGeluTanh: {
      const double sqrt_2_over_pi = std::sqrt(2.0 / std::numbers::pi);
      return 0.5 * x * (1.0 + std::tanh(sqrt_2_over_pi * (x + 0.044715 * x * x * x)));
    }
    case ops::Activation::kReluSquared:
      return x > 0.0 ? x * x : 0.0;
  }
  return NAN;
}

std::string ActivationName(ops::Activation act) {
  switch (act) {
    case ops::Activation::kGelu:
      return "Gelu";
    case ops::Activation::kGeluTanh:
      return "GeluTanh";
    case ops::Activation::kReluSquared:
      return "ReluSquared";
  }
  return "?";
}

// fp32 evaluation error allowances, for |x| <= 5 and |dy| <= 1. Forward: the GELUs round a
// handful of operations on magnitudes <= |x| (each <= u relative) and libm's erff/tanhf (<= 2
// ulp); for negative x, 1 + erf (1 + tanh) cancels, turning an error of ~2 ulp(1) = 2^-23 in it
// into an absolute error 0.5 |x| 2^-23 <= 2^-21.7 (observed: 7e-8 at x = -5). We allow 2^-20
// absolute plus 2^-20 relative (> 3x the analysis), while the erf and tanh forms differ by up to
// 4.7e-4, so a swapped formula fails. Backward: tanh's 1 - t^2 cancels the same way and is
// multiplied by 0.5 |x| dinner <= 8.7, so <= 2^-19.9 absolute (observed 3e-7); we allow 2^-18
// absolute plus 2^-20 relative. ReLU^2 is within 2u. The central differences (h = 1e-6, per
// element, in double) add < 1e-9, and at the ReLU^2 kink x = 0 exactly |dy| h/2 <= 5e-7 < 2^-18.
constexpr double kForwardAbs = 0x1p-20, kForwardRel = 0x1p-20;
constexpr double kBackwardAbs = 0x1p-18, kBackwardRel = 0x1p-20;

std::vector<float> ActivationInputs(size_t n, uint32_t seed) {
  std::vector<float> x = RandomFloats(n, seed, -5.0f, 5.0f);
  // The kink and sign change at 0 (both signs), tiny values, and the ends of the range.
  const float specials[] = {0.0f, -0.0f, 1e-3f, -1e-3f, 1e-6f, -1e-6f, 5.0f, -5.0f, 1.0f, -1.0f};
  std::copy(std::begin(specials), std::end(specials), x.begin());
  return x;
}

class ActivationTest : public ::testing::TestWithParam<ops::Activation> {};

TEST_P(ActivationTest, ForwardMatchesDoubleReference) {
  const ops::Activation act = GetParam();
  uint32_t seed = 40;
  for (DType dtype : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<float> x = ActivationInputs(4 * 129, ++seed);
    const Tensor tx = MakeTensor(dtype, {4, 129}, x);
    const Tensor ty = MakeZeros(dtype, {4, 129});
    NF_ASSERT_OK(ops::ActivationForward(act, tx, ty));
    std::vector<double> expected;
    for (double v : Rounded(dtype, x)) expected.push_back(ReferenceActivation(act, v));
    // fp32 evaluation (kForward*) then the output rounding (half ulp relative, subnormal step).
    ExpectAllClose(ToDoubles(ty), expected, kForwardAbs + SubnormalHalfStep(dtype),
                   kForwardRel + HalfUlp(dtype), "y");
    // The same values computed in place.
    NF_ASSERT_OK(ops::ActivationForward(act, tx, tx));
    ExpectSameValues(tx, ty, "in place");
  }
}

TEST_P(ActivationTest, BackwardMatchesFiniteDifferences) {
  const ops::Activation act = GetParam();
  uint32_t seed = 60;
  for (DType dtype : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t n = 3 * 67;
    const std::vector<float> x = ActivationInputs(n, ++seed);
    const std::vector<float> dy = RandomFloats(n, ++seed);
    const Tensor tx = MakeTensor(dtype, {3, 67}, x);
    const Tensor tdy = MakeTensor(dtype, {3, 67}, dy);
    const Tensor tdx = MakeZeros(dtype, {3, 67});
    NF_ASSERT_OK(ops::ActivationBackward(act, tx, tdy, tdx));
    const std::vector<double> rx = Rounded(dtype, x), rdy = Rounded(dtype, dy);
    std::vector<double> expected(n);
    for (int64_t i = 0; i < n; ++i) {
      // d/dx of dy * act(x), per element, by central differences of the double forward.
      expected[i] = NumericGradient(
          [&](const std::vector<double>& v) { return rdy[i] * ReferenceActivation(act, v[0]); },
          {rx[i]})[0];
    }
    ExpectAllClose(ToDoubles(tdx), expected, kBackwardAbs + SubnormalHalfStep(dtype),
                   kBackwardRel + HalfUlp(dtype), "dx");
    // In place: dx written over dy.
    NF_ASSERT_OK(ops::ActivationBackward(act, tx, tdy, tdy));
    ExpectSameValues(tdy, tdx, "in place");
  }
}

TEST_P(ActivationTest, EdgeShapes) {
  const ops::Activation act = GetParam();
  for (const Shape& shape : {Shape{0}, Shape{0, 7}, Shape{7, 0}}) {
    const Tensor empty = MakeZeros(DType::kBF16, shape);
    NF_EXPECT_OK(ops::ActivationForward(act, empty, empty));
    NF_EXPECT_OK(ops::ActivationBackward(act, empty, empty, empty));
  }
  // A single element in a [1, 1, 1] tensor: x = 2.
  const Tensor x = MakeTensor(DType::kF32, {1, 1, 1}, {2.0f});
  const Tensor y = MakeZeros(DType::kF32, {1, 1, 1});
  NF_ASSERT_OK(ops::ActivationForward(act, x, y));
  // Within the forward allowance above.
  EXPECT_NEAR(ToDoubles(y)[0], ReferenceActivation(act, 2.0), kForwardAbs + kForwardRel * 4);
}

TEST_P(ActivationTest, RejectsBadArguments) {
  const ops::Activation act = GetParam();
  const Tensor x = MakeZeros(DType::kF32, {2, 3});
  ExpectInvalidArgument(ops::ActivationForward(act, x, MakeZeros(DType::kF16, {2, 3})),
                        "ActivationForward", "y is f16[2, 3] on cpu, expected dtype f32");
  ExpectInvalidArgument(ops::ActivationForward(act, x, MakeZeros(DType::kF32, {3, 2})),
                        "ActivationForward", "expected shape [2, 3]");
  ExpectInvalidArgument(ops::ActivationForward(act, MakeZeros(DType::kI32, {2, 3}), x),
                        "ActivationForward", "x is i32[2, 3]");
  ExpectInvalidArgument(ops::ActivationBackward(act, x, MakeZeros(DType::kBF16, {2, 3}), x),
                        "ActivationBackward", "dy is bf16[2, 3]");
  ExpectInvalidArgument(ops::ActivationBackward(act, x, x, MakeZeros(DType::kF32, {6})),
                        "ActivationBackward", "dx is f32[6]");
}

INSTANTIATE_TEST_SUITE_P(AllActivations, ActivationTest,
                         ::testing::Values(ops::Activation::kGelu, ops::Activation::kGeluTanh,
                                           ops::Activation::kReluSquared),
                         [](const auto& info) { return ActivationName(info.param); });

TEST(GeluTest, ExactAndTanhFormsDiffer) {
  // The exact and tanh GELUs are different functions: at x = -3 they differ by 4.1e-4, far
  // beyond the forward allowance, so each kernel is pinned to its own formula.
  const Tensor x = MakeTensor(DType::kF32, {1}, {-3.0f});
  const Tensor exact = MakeZeros(DType::kF32, {1}), approx = MakeZeros(DType::kF32, {1});
  NF_ASSERT_OK(ops::ActivationForward(ops::Activation::kGelu, x, exact));
  NF_ASSERT_OK(ops::ActivationForward(ops::Activation::kGeluTanh, x, approx));
  EXPECT_GT(std::abs(ToDoubles(exact)[0] - ToDoubles(approx)[0]), 4e-4);
}

// ---- Dropout -----------------------------------------------------------------------------------

// Nonzero inputs of both signs, so a zero output can only mean "dropped".
std::vector<float> NonzeroInputs(size_t n, uint32_t seed) {
  std::vector<float> x = RandomFloats(n, seed, 0.25f, 2.0f);
  for (size_t i = 0; i < n; i += 2) x[i] = -x[i];
  return x;
}

// The keep decision ops.h and philox.h specify for element (t, c) of a [tokens, cols] tensor.
bool ReferenceKeep(const ops::DropoutSpec& spec, int64_t t, int64_t c) {
  const uint64_t sample = spec.first_sample + t / spec.seq_len;
  const uint64_t row = t % spec.seq_len;
  const uint64_t col = spec.col_offset + c;
  return DropoutWords(spec.seed, spec.site, sample, 0, row, col)[col & 3] >=
         DropoutThreshold(spec.p);
}

// Runs Dropout on x (values given) into a fresh tensor and returns it.
Tensor RunDropout(DType dtype, Shape shape, const std::vector<float>& x,
                  const ops::DropoutSpec& spec) {
  const Tensor tx = MakeTensor(dtype, shape, x);
  const Tensor ty = MakeZeros(dtype, shape);
  const absl::Status status = ops::Dropout(tx, ty, spec);
  NF_EXPECT_OK(status);
  return ty;
}

TEST(DropoutTest, ZeroProbabilityIsIdentity) {
  for (DType dtype : kFloatDTypes) {
    const std::vector<float> x = RandomFloats(5 * 9, 3, -100.0f, 100.0f);
    const Tensor tx = MakeTensor(dtype, {5, 9}, x);
    ops::DropoutSpec spec;
    spec.p = 0.0f;
    spec.seed = 7;
    ExpectSameValues(RunDropout(dtype, {5, 9}, x, spec), tx, "p = 0");
    NF_ASSERT_OK(ops::Dropout(tx, tx, spec));  // in place
    ExpectSameValues(tx, MakeTensor(dtype, {5, 9}, x), "p = 0 in place");
  }
}

TEST(DropoutTest, OutputsAreZeroOrScaledInput) {
  uint32_t seed = 80;
  for (DType dtype : kFloatDTypes) {
    for (float p : {0.1f, 0.5f, 0.9f}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " p=", p));
      const std::vector<float> x = NonzeroInputs(16 * 33, ++seed);
      ops::DropoutSpec spec{.p = p, .seed = 1234, .site = 5, .first_sample = 0, .seq_len = 4};
      const std::vector<double> y = ToDoubles(RunDropout(dtype, {16, 33}, x, spec));
      const std::vector<double> rx = Rounded(dtype, x);
      int kept = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        if (y[i] == 0.0) continue;
        ++kept;
        // x * fp32(1 / (1 - p)) in fp32: two roundings (2u) then the output's half ulp.
        const double expected = rx[i] / (1.0 - static_cast<double>(p));
        ASSERT_NEAR(y[i], expected, (2 * kU32 + HalfUlp(dtype)) * std::abs(expected)) << i;
      }
      EXPECT_GT(kept, 0);                           // something kept ...
      EXPECT_LT(kept, static_cast<int>(y.size()));  // ... and something dropped
    }
  }
}

TEST(DropoutTest, KeepFractionIsOneMinusP) {
  // 2^17 elements: the kept count is Binomial(n, 1 - p), standard deviation
  // sqrt(n p (1 - p)) <= 181. We require the fraction within 6 standard deviations of 1 - p (a
  // correct generator fails with probability < 2e-9; the seed is fixed, so the test is
  // deterministic), i.e. |fraction - (1 - p)| <= 6 sqrt(p (1 - p) / n) <= 0.0083.
  const int64_t rows = 256, cols = 512, n = rows * cols;
  const std::vector<float> x = NonzeroInputs(n, 9);
  for (float p : {0.01f, 0.1f, 0.5f, 0.9f}) {
    ops::DropoutSpec spec{.p = p, .seed = 42, .site = 3, .first_sample = 17, .seq_len = 64};
    const std::vector<double> y = ToDoubles(RunDropout(DType::kF32, {rows, cols}, x, spec));
    int64_t kept = 0;
    for (double v : y) kept += v != 0.0;
    const double fraction = static_cast<double>(kept) / n;
    EXPECT_NEAR(fraction, 1.0 - p, 6.0 * std::sqrt(p * (1.0 - p) / n)) << "p=" << p;
  }
}

TEST(DropoutTest, MaskFollowsGlobalCoordinates) {
  // The kept elements are exactly those the Philox contract (ops.h, philox.h) selects, for
  // multi-sample tensors with a shard offset that is not a multiple of 4.
  uint32_t seed = 100;
  for (DType dtype : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t tokens = 3 * 5, cols = 13;
    ops::DropoutSpec spec{
        .p = 0.3f, .seed = 99, .site = 11, .first_sample = 6, .seq_len = 5, .col_offset = 7};
    const std::vector<float> x = NonzeroInputs(tokens * cols, ++seed);
    const std::vector<double> y = ToDoubles(RunDropout(dtype, {3, 5, cols}, x, spec));
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(y[t * cols + c] != 0.0, ReferenceKeep(spec, t, c))
            << "(" << t << ", " << c << ")";
      }
    }
  }
}

TEST(DropoutTest, MaskDependsOnSeedSiteAndSample) {
  const int64_t rows = 8, cols = 64;
  const std::vector<float> x = NonzeroInputs(rows * cols, 5);
  const ops::DropoutSpec base{.p = 0.5f, .seed = 1, .site = 2, .first_sample = 0, .seq_len = 4};
  const std::vector<double> y = ToDoubles(RunDropout(DType::kF32, {rows, cols}, x, base));
  auto mask_differs = [&](const ops::DropoutSpec& other) {
    const std::vector<double> z = ToDoubles(RunDropout(DType::kF32, {rows, cols}, x, other));
    for (size_t i = 0; i < y.size(); ++i) {
      if ((y[i] == 0.0) != (z[i] == 0.0)) return true;
    }
    return false;
  };
  ops::DropoutSpec spec = base;
  spec.seed = 2;
  EXPECT_TRUE(mask_differs(spec)) << "seed";
  spec = base;
  spec.site = 3;
  EXPECT_TRUE(mask_differs(spec)) << "site";
  spec = base;
  spec.first_sample = 2;
  EXPECT_TRUE(mask_differs(spec)) << "first_sample";
  // Within one tensor: the two samples' rows at the same position draw different masks.
  bool rows_differ = false;
  for (int64_t c = 0; c < cols; ++c) rows_differ |= (y[c] == 0.0) != (y[4 * cols + c] == 0.0);
  EXPECT_TRUE(rows_differ);
}

TEST(DropoutTest, BackwardOnGradientReproducesTheMask) {
  uint32_t seed = 120;
  for (DType dtype : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const ops::DropoutSpec spec{
        .p = 0.25f, .seed = 5, .site = 8, .first_sample = 3, .seq_len = 6, .col_offset = 2};
    const std::vector<float> x = NonzeroInputs(12 * 21, ++seed);
    const std::vector<float> dy = NonzeroInputs(12 * 21, ++seed);
    const std::vector<double> y = ToDoubles(RunDropout(dtype, {12, 21}, x, spec));
    // The backward is the same call on dy, here in place.
    const Tensor tdy = MakeTensor(dtype, {12, 21}, dy);
    NF_ASSERT_OK(ops::Dropout(tdy, tdy, spec));
    const std::vector<double> dx = ToDoubles(tdy);
    const std::vector<double> rdy = Rounded(dtype, dy);
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(y[i] == 0.0, dx[i] == 0.0) << i;
      if (dx[i] != 0.0) {
        // dy / (1 - p): two fp32 roundings and the output's half ulp, as above.
        ASSERT_NEAR(dx[i], rdy[i] / 0.75, (2 * kU32 + HalfUlp(dtype)) * std::abs(rdy[i] / 0.75))
            << i;
      }
    }
  }
}

// Columns [c0, c0 + w) and rows [r0, r0 + h) of a [rows, cols] tensor.
std::vector<float> Block(const std::vector<float>& full, int64_t cols, int64_t r0, int64_t h,
                         int64_t c0, int64_t w) {
  std::vector<float> out;
  for (int64_t r = r0; r < r0 + h; ++r) {
    for (int64_t c = c0; c < c0 + w; ++c) out.push_back(full[r * cols + c]);
  }
  return out;
}

TEST(DropoutTest, ShardsDrawTheFullTensorsMask) {
  // DESIGN's central promise: the mask is a function of global coordinates, so a
  // tensor-parallel column shard and a data-parallel block of samples see exactly the values
  // the unsharded tensor gets at those coordinates -- bitwise, as each element's arithmetic is
  // the same.
  const int64_t samples = 4, seq_len = 6, cols = 26, tokens = samples * seq_len;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<float> x = NonzeroInputs(tokens * cols, 77);
    const ops::DropoutSpec full_spec{
        .p = 0.4f, .seed = 2024, .site = 6, .first_sample = 10, .seq_len = seq_len};
    const std::vector<double> y_full = ToDoubles(RunDropout(dtype, {tokens, cols}, x, full_spec));
    // Column shards at aligned and unaligned offsets (Philox words cover 4 columns), including
    // a 1-column shard and one ending at the last column; row blocks of whole samples.
    const int64_t shards[][2] = {{0, 13}, {13, 13}, {5, 7}, {3, 1}, {8, 4}, {21, 5}, {0, 26}};
    const int64_t blocks[][2] = {{0, 4}, {1, 2}, {3, 1}};
    for (const auto& [c0, w] : shards) {
      for (const auto& [s0, count] : blocks) {
        SCOPED_TRACE(
            absl::StrCat("cols [", c0, ", ", c0 + w, "), samples [", s0, ", ", s0 + count, ")"));
        ops::DropoutSpec spec = full_spec;
        spec.col_offset = c0;
        spec.first_sample = full_spec.first_sample + s0;
        const int64_t r0 = s0 * seq_len, h = count * seq_len;
        const std::vector<double> y =
            ToDoubles(RunDropout(dtype, {h, w}, Block(x, cols, r0, h, c0, w), spec));
        std::vector<double> expected;
        for (int64_t r = r0; r < r0 + h; ++r) {
          for (int64_t c = c0; c < c0 + w; ++c) expected.push_back(y_full[r * cols + c]);
        }
        ASSERT_EQ(y, expected);
      }
    }
    // Sequence-parallel row shards: any run of tokens, starting and ending inside a sample,
    // named by token_offset (the whole micro-batch's first_sample unchanged).
    const int64_t token_runs[][2] = {{0, 24}, {5, 9}, {7, 1}, {11, 13}, {17, 3}};
    for (const auto& [t0, h] : token_runs) {
      SCOPED_TRACE(absl::StrCat("tokens [", t0, ", ", t0 + h, ")"));
      ops::DropoutSpec spec = full_spec;
      spec.token_offset = t0;
      const std::vector<double> y =
          ToDoubles(RunDropout(dtype, {h, cols}, Block(x, cols, t0, h, 0, cols), spec));
      const std::vector<double> expected(y_full.begin() + t0 * cols,
                                         y_full.begin() + (t0 + h) * cols);
      ASSERT_EQ(y, expected);
    }
  }
}

TEST(DropoutTest, EmptyAndLengthOneShapes) {
  const ops::DropoutSpec spec{.p = 0.5f, .seed = 3, .site = 1, .first_sample = 0, .seq_len = 1};
  NF_EXPECT_OK(ops::Dropout(MakeZeros(DType::kF16, {0, 8}), MakeZeros(DType::kF16, {0, 8}), spec));
  NF_EXPECT_OK(ops::Dropout(MakeZeros(DType::kF32, {8, 0}), MakeZeros(DType::kF32, {8, 0}), spec));
  // One column over many one-token samples: element t has sample t, row 0, column 0.
  const std::vector<float> x = NonzeroInputs(64, 4);
  const std::vector<double> y = ToDoubles(RunDropout(DType::kBF16, {64, 1}, x, spec));
  for (int64_t t = 0; t < 64; ++t) EXPECT_EQ(y[t] != 0.0, ReferenceKeep(spec, t, 0)) << t;
}

TEST(DropoutTest, RejectsInvalidSpecs) {
  const Tensor x = MakeZeros(DType::kF32, {4, 4});
  for (float p : {1.0f, 1.5f, -0.1f, std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::infinity()}) {
    ExpectInvalidArgument(ops::Dropout(x, x, {.p = p}), "Dropout", "invalid dropout");
  }
  ExpectInvalidArgument(ops::Dropout(x, x, {.p = 0.1f, .seq_len = 0}), "Dropout", "seq_len=0");
  ExpectInvalidArgument(ops::Dropout(x, x, {.p = 0.1f, .col_offset = -1}), "Dropout",
                        "col_offset=-1");
  ExpectInvalidArgument(ops::Dropout(x, x, {.p = 0.1f, .token_offset = -1}), "Dropout",
                        "token_offset=-1");
  ExpectInvalidArgument(ops::Dropout(x, MakeZeros(DType::kF16, {4, 4}), {.p = 0.1f}), "Dropout",
                        "y is f16[4, 4]");
  ExpectInvalidArgument(ops::Dropout(x, MakeZeros(DType::kF32, {16}), {.p = 0.1f}), "Dropout",
                        "expected shape [4, 4]");
  ExpectInvalidArgument(
      ops::Dropout(MakeZeros(DType::kU8, {4}), MakeZeros(DType::kU8, {4}), {.p = 0.1f}), "Dropout",
      "x is u8[4]");
}

// ---- Cast --------------------------------------------------------------------------------------

// v rounded to nearest even into a binary format with `mantissa_bits` stored bits, smallest
// normal exponent `min_exponent` and largest `max_exponent`: values beyond the largest finite
// number by half an ulp or more become inf; subnormals have the fixed spacing of the smallest
// normal binade. Exact in double: scaling by powers of two and nearbyint (default mode: even).
double RoundToFormat(double v, int mantissa_bits, int min_exponent, int max_exponent) {
  if (std::isnan(v) || std::isinf(v) || v == 0.0) return v;
  const int exponent = std::max(std::ilogb(v), min_exponent);
  const double ulp = std::ldexp(1.0, exponent - mantissa_bits);
  const double rounded = std::nearbyint(v / ulp) * ulp;
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -mantissa_bits), max_exponent);
  if (std::abs(rounded) > max_finite) return std::copysign(INFINITY, v);
  return std::copysign(rounded, v);  // keeps the sign of values that round to zero
}

double ReferenceCast(DType dst, double v) {
  switch (dst) {
    case DType::kF16:
      return RoundToFormat(v, 10, -14, 15);
    case DType::kBF16:
      return RoundToFormat(v, 7, -126, 127);
    default:
      return RoundToFormat(v, 23, -126, 127);
  }
}

std::vector<float> CastInputs() {
  std::vector<float> v = {
      0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
      -std::numeric_limits<float>::quiet_NaN(),
      // Exact ties: to fp16 (1 + 2^-11 -> 1, 1 + 3 2^-11 -> 1 + 2^-9) and to bf16 (1 + 2^-8 ->
      // 1, 1 + 3 2^-8 -> 1 + 2^-6), and just off them.
      1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-11f),
      1.0f + 0x1p-11f + 0x1p-20f, 1.0f + 0x1p-8f + 0x1p-20f,
      // fp16's range: the largest finite, the overflow tie 65520 (-> inf), just below it, and
      // beyond; the smallest subnormal, its half (a tie to 0), 1.5 of it (a tie to 2^-23),
      // the smallest normal and below the subnormal range.
      65504.0f, 65520.0f, 65519.0f, -70000.0f, 1e10f, 0x1p-24f, 0x1p-25f, -0x1p-25f, 3 * 0x1p-25f,
      0x1p-14f, 0x1p-30f, 5.96e-8f,
      // fp32 extremes: the largest finite (-> bf16 inf: it is past bf16's largest by more than
      // half an ulp), a denormal and the smallest normal.
      std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min() * 12345,
      std::numeric_limits<float>::min()};
  // Random values over exponents 2^-30 .. 2^18 with full fp32 mantissas.
  const std::vector<float> mantissa = RandomFloats(400, 11, 1.0f, 2.0f);
  const std::vector<float> exponent = RandomFloats(400, 12, -30.0f, 18.0f);
  for (size_t i = 0; i < mantissa.size(); ++i) {
    const float value = std::ldexp(mantissa[i], static_cast<int>(std::floor(exponent[i])));
    v.push_back(i % 2 ? -value : value);
  }
  return v;
}

TEST(CastTest, AllFloatPairsRoundToNearestEven) {
  const std::vector<float> values = CastInputs();
  const int64_t n = static_cast<int64_t>(values.size());
  for (DType src : kFloatDTypes) {
    for (DType dst : kFloatDTypes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(src), " -> ", DTypeName(dst)));
      const Tensor tsrc = MakeTensor(src, {n}, values);
      const Tensor tdst = MakeZeros(dst, {n});
      NF_ASSERT_OK(ops::Cast(tsrc, tdst));
      const std::vector<double> source = ToDoubles(tsrc);  // the values as stored in src
      const std::vector<double> actual = ToDoubles(tdst);
      for (int64_t i = 0; i < n; ++i) {
        const double expected = ReferenceCast(dst, source[i]);
        if (std::isnan(expected)) {
          ASSERT_TRUE(std::isnan(actual[i])) << "element " << i << " (" << source[i] << ")";
          continue;
        }
        // Exact: casting is one correctly rounded conversion.
        ASSERT_EQ(actual[i], expected) << "element " << i << " (" << source[i] << ")";
        ASSERT_EQ(std::signbit(actual[i]), std::signbit(expected)) << "element " << i;
      }
    }
  }
}

TEST(CastTest, TiesRoundToEven) {
  // Spelled out, independent of RoundToFormat: fp32 -> fp16 and fp32 -> bf16 at exact ties.
  const Tensor src = MakeTensor(
      DType::kF32, {4}, {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f});
  const Tensor f16 = MakeZeros(DType::kF16, {4}), bf16 = MakeZeros(DType::kBF16, {4});
  NF_ASSERT_OK(ops::Cast(src, f16));
  NF_ASSERT_OK(ops::Cast(src, bf16));
  // fp16 (10 bits): the first two are ties, the last two exact.
  EXPECT_EQ(ToDoubles(f16),
            (std::vector<double>{1.0, 1.0 + 0x1p-9, 1.0 + 0x1p-8, 1.0 + 3 * 0x1p-8}));
  // bf16 (7 bits): the first two round to 1 (below a tie), the last two are ties.
  EXPECT_EQ(ToDoubles(bf16), (std::vector<double>{1.0, 1.0, 1.0, 1.0 + 0x1p-6}));
}

TEST(CastTest, ShapesViewsAndErrors) {
  // Same element count under another shape; a tensor cast onto itself; empty tensors.
  const Tensor src = MakeTensor(DType::kF32, {2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor dst = MakeZeros(DType::kBF16, {6});
  NF_ASSERT_OK(ops::Cast(src, dst));
  EXPECT_EQ(ToDoubles(dst), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  NF_ASSERT_OK(ops::Cast(src, src));
  EXPECT_EQ(ToDoubles(src), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  NF_EXPECT_OK(ops::Cast(MakeZeros(DType::kF16, {0, 3}), MakeZeros(DType::kF32, {0})));
  ExpectInvalidArgument(ops::Cast(src, MakeZeros(DType::kF16, {5})), "Cast",
                        "dst is f16[5] on cpu, expected 6 elements like src");
  ExpectInvalidArgument(ops::Cast(src, MakeZeros(DType::kI32, {6})), "Cast", "dst is i32[6]");
  ExpectInvalidArgument(ops::Cast(MakeZeros(DType::kI64, {6}), src), "Cast", "src is i64[6]");
}

// ---- Fill, Scale, Axpy -------------------------------------------------------------------------

TEST(FillTest, FloatDTypesGetTheRoundedValue) {
  for (DType dtype : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    for (float value : {0.1f, -3.0f, 70000.0f, -INFINITY}) {
      const Tensor x = MakeTensor(dtype, {3, 5}, RandomFloats(15, 1));
      NF_ASSERT_OK(ops::Fill(x, value));
      // Exactly the value rounded to nearest even into dtype (70000 is inf in fp16).
      const double expected = ReferenceCast(dtype, value);
      for (double v : ToDoubles(x)) ASSERT_EQ(v, expected) << value;
    }
    const Tensor x = MakeZeros(dtype, {4});
    NF_ASSERT_OK(ops::Fill(x, std::numeric_limits<float>::quiet_NaN()));
    for (double v : ToDoubles(x)) EXPECT_TRUE(std::isnan(v));
  }
}

template <typename T>
void ExpectFilledWith(DType dtype, float value, T expected) {
  SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ", value));
  const Tensor x = MakeZeros(dtype, {2, 3});
  NF_ASSERT_OK(ops::Fill(x, value));
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(x.data<T>()[i], expected) << i;
}

TEST(FillTest, IntegerDTypes) {
  ExpectFilledWith<int32_t>(DType::kI32, -7.0f, -7);
  ExpectFilledWith<int32_t>(DType::kI32, 123456.0f, 123456);
  ExpectFilledWith<int64_t>(DType::kI64, 0x1p40f, int64_t{1} << 40);
  ExpectFilledWith<int64_t>(DType::kI64, -1.0f, -1);
  ExpectFilledWith<uint16_t>(DType::kU16, 65535.0f, 65535);
  ExpectFilledWith<uint8_t>(DType::kU8, 255.0f, 255);
  ExpectFilledWith<uint8_t>(DType::kU8, 0.0f, 0);
}

TEST(FillTest, ViewsEmptyAndUndefined) {
  // Filling a view writes exactly its elements.
  const Tensor storage = MakeTensor(DType::kF16, {10}, std::vector<float>(10, 2.0f));
  NF_ASSERT_OK(ops::Fill(*storage.View(3, {2, 2}), -1.0f));
  EXPECT_EQ(ToDoubles(storage), (std::vector<double>{2, 2, 2, -1, -1, -1, -1, 2, 2, 2}));
  NF_EXPECT_OK(ops::Fill(MakeZeros(DType::kI32, {0, 4}), 1.0f));
  ExpectInvalidArgument(ops::Fill(Tensor(), 1.0f), "Fill", "x is missing");
}

TEST(ScaleTest, MultipliesInPlace) {
  uint32_t seed = 140;
  for (DType dtype : kFloatDTypes) {
    for (float alpha : {0.5f, -3.7f, 1e-3f, 0.0f}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " alpha=", alpha));
      const std::vector<float> x = RandomFloats(7 * 19, ++seed, -8.0f, 8.0f);
      const Tensor tx = MakeTensor(dtype, {7, 19}, x);
      NF_ASSERT_OK(ops::Scale(tx, alpha));
      std::vector<double> expected;
      for (double v : Rounded(dtype, x)) expected.push_back(alpha * v);
      // One fp32 product (u) then the output rounding: |fl16(fl32(p)) - p| <= (half ulp)(1+u)|p|
      // + u|p| < (half ulp + 2u)|p|, plus fp16's subnormal step for tiny products.
      ExpectAllClose(ToDoubles(tx), expected, SubnormalHalfStep(dtype), HalfUlp(dtype) + 2 * kU32,
                     "alpha x");
    }
  }
  NF_EXPECT_OK(ops::Scale(MakeZeros(DType::kBF16, {0}), 2.0f));
  ExpectInvalidArgument(ops::Scale(MakeZeros(DType::kI32, {3}), 2.0f), "Scale", "x is i32[3]");
}

TEST(AxpyTest, MixedDTypes) {
  uint32_t seed = 160;
  for (DType x_dtype : kFloatDTypes) {
    for (DType y_dtype : kFloatDTypes) {
      SCOPED_TRACE(absl::StrCat("x ", DTypeName(x_dtype), ", y ", DTypeName(y_dtype)));
      const float alpha = -0.625f;
      const std::vector<float> x = RandomFloats(5 * 13, ++seed, -4.0f, 4.0f);
      const std::vector<float> y = RandomFloats(5 * 13, ++seed, -4.0f, 4.0f);
      // x [5, 13] into y [65]: only the element count must match.
      const Tensor ty = MakeTensor(y_dtype, {65}, y);
      NF_ASSERT_OK(ops::Axpy(alpha, MakeTensor(x_dtype, {5, 13}, x), ty));
      const std::vector<double> rx = Rounded(x_dtype, x), ry = Rounded(y_dtype, y);
      const std::vector<double> actual = ToDoubles(ty);
      for (size_t i = 0; i < rx.size(); ++i) {
        const double expected = ry[i] + alpha * rx[i];
        // fp32: the product and the sum round once each, <= u (|y| + |alpha x|) each (fused or
        // not); then the output's half ulp of the fp32 result and fp16's subnormal step.
        const double fp32_error = 2 * kU32 * (std::abs(ry[i]) + std::abs(alpha * rx[i]));
        ASSERT_NEAR(actual[i], expected,
                    fp32_error + HalfUlp(y_dtype) * (std::abs(expected) + fp32_error) +
                        SubnormalHalfStep(y_dtype))
            << i;
      }
    }
  }
}

TEST(AxpyTest, EmptyAndBadArguments) {
  NF_EXPECT_OK(ops::Axpy(2.0f, MakeZeros(DType::kF16, {0}), MakeZeros(DType::kF32, {0, 3})));
  ExpectInvalidArgument(ops::Axpy(1.0f, MakeZeros(DType::kF16, {4}), MakeZeros(DType::kF32, {5})),
                        "Axpy", "y is f32[5] on cpu, expected 4 elements like x");
  ExpectInvalidArgument(ops::Axpy(1.0f, MakeZeros(DType::kF16, {4}), MakeZeros(DType::kI32, {4})),
                        "Axpy", "y is i32[4]");
  ExpectInvalidArgument(ops::Axpy(1.0f, MakeZeros(DType::kI64, {4}), MakeZeros(DType::kF32, {4})),
                        "Axpy", "x is i64[4]");
}

TEST(CopyTest, CopiesAnyDTypeAndRefusesMismatches) {
  const Tensor ids = testing::MakeIds({3}, {7, -2, 40000});
  const Tensor out = MakeZeros(DType::kI32, {1, 3});
  NF_ASSERT_OK(ops::Copy(ids, out));
  EXPECT_EQ(out.data<int32_t>()[2], 40000);
  ExpectInvalidArgument(ops::Copy(ids, MakeZeros(DType::kF32, {3})), "Copy", "dst is f32[3]");
  ExpectInvalidArgument(ops::Copy(ids, MakeZeros(DType::kI32, {4})), "Copy", "dst is i32[4]");
}

TEST(ZerosTest, HostTensorsAndTheirHostView) {
  auto zeros = ops::Zeros(DType::kBF16, {2, 5}, Device::Cpu());
  NF_ASSERT_OK(zeros);
  EXPECT_EQ(ToDoubles(*zeros), std::vector<double>(10, 0.0));
  auto host = ops::OnHost(*zeros);
  NF_ASSERT_OK(host);
  EXPECT_TRUE(host->SharesStorageWith(*zeros)) << "a host tensor is its own host view";
}

}  // namespace
}  // namespace nf
