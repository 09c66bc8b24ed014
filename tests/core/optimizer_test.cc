// Optimizer and mixed-precision ops against float64 references written here: AdamWStep over
// several steps (bias correction, decoupled weight decay, eps placement), UnscaleAndCheck's
// scaling and its sticky non-finite flag, and SquaredNorm's accumulation and accuracy.
//
// AdamWStep and UnscaleAndCheck take fp32 tensors only (master weights and main grads), so their
// fp16 / bf16 cases are rejections; SquaredNorm reads any floating dtype, and its fp16 / bf16
// references use the values as rounded to that dtype (tests/test_util.h Rounded).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf {
namespace {

using ::nf::testing::ExpectInvalidArgument;
using ::nf::testing::kU32;
using ::nf::testing::MakeTensor;
using ::nf::testing::MakeZeros;
using ::nf::testing::RandomFloats;
using ::nf::testing::Rounded;
using ::nf::testing::ToDoubles;

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// ---- AdamWStep ---------------------------------------------------------------------------------

// The optimizer state in double, with a first-order bound on how far an fp32 implementation of
// the same formula may drift from it (a running error analysis: every fp32 operation adds at most
// u times its result, and earlier errors propagate through the formula's derivatives).
struct AdamReference {
  std::vector<double> p, m, v;
  std::vector<double> err_p, err_m, err_v;

  explicit AdamReference(const std::vector<float>& params)
      : p(params.begin(), params.end()),
        m(params.size(), 0.0),
        v(params.size(), 0.0),
        err_p(params.size(), 0.0),
        err_m(params.size(), 0.0),
        err_v(params.size(), 0.0) {}

  // One step of ops.h's formula with the fp32 hyper-parameters the kernel sees.
  void Step(const std::vector<float>& grads, const ops::AdamWArgs& a) {
    const double b1 = a.beta1, b2 = a.beta2, lr = a.lr, eps = a.eps, wd = a.weight_decay;
    const double bc1 = 1.0 - std::pow(b1, static_cast<double>(a.step));
    const double bc2 = 1.0 - std::pow(b2, static_cast<double>(a.step));
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = grads[i];
      // m = b1 m + (1 - b1) g: two products and a sum, each rounded (1 - b1 is exact in fp32).
      const double m_terms = std::abs(b1 * m[i]) + std::abs((1 - b1) * g);
      m[i] = b1 * m[i] + (1 - b1) * g;
      err_m[i] = b1 * err_m[i] + 2 * kU32 * m_terms;
      // v = b2 v + (1 - b2) g^2: three products and a sum.
      const double v_terms = b2 * v[i] + (1 - b2) * g * g;
      v[i] = v_terms;
      err_v[i] = b2 * err_v[i] + 3 * kU32 * v_terms;
      // denom = sqrt(v / bc2) + eps: sqrt(v) (err_v / (2 sqrt v) propagated, u rounded), times
      // 1 / sqrt(bc2) (bc2 rounded to fp32, a square root and a reciprocal: 2.5u), plus eps (u).
      const double sqrt_vhat = std::sqrt(v[i] / bc2);
      const double denom = sqrt_vhat + eps;
      const double err_denom =
          (v[i] > 0 ? err_v[i] / (2 * std::sqrt(v[i] * bc2)) : 0.0) + 5.5 * kU32 * denom;
      // update = (lr / bc1) m / denom: lr / bc1 rounded (2u), a product and a quotient (2u);
      // m's and denom's errors propagate.
      const double update = lr / bc1 * m[i] / denom;
      const double err_update = 4 * kU32 * std::abs(update) + lr / bc1 * err_m[i] / denom +
                                std::abs(update) * err_denom / denom;
      // p -= (lr wd) p + update: lr wd and its product with p (2u), the sum and the difference.
      const double decay = lr * wd * p[i];
      const double p_new = p[i] - (decay + update);
      err_p[i] = err_p[i] * std::abs(1 - lr * wd) + err_update + 2 * kU32 * std::abs(decay) +
                 kU32 * std::abs(decay + update) + kU32 * std::abs(p_new);
      p[i] = p_new;
    }
  }
};

struct AdamTensors {
  Tensor params, grads, exp_avg, exp_avg_sq;
};

AdamTensors MakeAdamTensors(const std::vector<float>& params) {
  const int64_t n = static_cast<int64_t>(params.size());
  return {MakeTensor(DType::kF32, {n}, params), MakeZeros(DType::kF32, {n}),
          MakeZeros(DType::kF32, {n}), MakeZeros(DType::kF32, {n})};
}

// Runs `steps` AdamW steps from step `first_step` on fresh state with the given gradients
// (one vector per step) and checks params and both moments after every step. The allowed
// deviation is twice the first-order fp32 error bound (the factor 2 covers second-order terms).
void CheckAdamAgainstReference(ops::AdamWArgs hyper, const std::vector<float>& params,
                               const std::vector<std::vector<float>>& grads) {
  AdamTensors t = MakeAdamTensors(params);
  AdamReference ref(params);
  for (size_t s = 0; s < grads.size(); ++s) {
    SCOPED_TRACE(absl::StrCat("step ", hyper.step));
    NF_ASSERT_OK(CopyFromFloats(t.grads, grads[s]));
    ops::AdamWArgs args = hyper;
    args.params = t.params;
    args.grads = t.grads;
    args.exp_avg = t.exp_avg;
    args.exp_avg_sq = t.exp_avg_sq;
    NF_ASSERT_OK(ops::AdamWStep(args));
    ref.Step(grads[s], hyper);
    const std::vector<double> p = ToDoubles(t.params), m = ToDoubles(t.exp_avg),
                              v = ToDoubles(t.exp_avg_sq);
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_LE(std::abs(m[i] - ref.m[i]), 2 * ref.err_m[i]) << "exp_avg " << i;
      ASSERT_LE(std::abs(v[i] - ref.v[i]), 2 * ref.err_v[i]) << "exp_avg_sq " << i;
      ASSERT_LE(std::abs(p[i] - ref.p[i]), 2 * ref.err_p[i])
          << "param " << i << ": " << p[i] << " vs " << ref.p[i];
    }
    ++hyper.step;
  }
}

// Gradients of magnitude [0.1, 1) with random signs, so every moment estimate is well defined.
std::vector<std::vector<float>> RandomGrads(size_t n, int steps, uint32_t seed,
                                            float scale = 1.0f) {
  std::vector<std::vector<float>> grads;
  for (int s = 0; s < steps; ++s) {
    std::vector<float> g = RandomFloats(n, seed + s, 0.1f * scale, scale);
    const std::vector<float> sign = RandomFloats(n, seed + 1000 + s);
    for (size_t i = 0; i < n; ++i) g[i] = sign[i] < 0 ? -g[i] : g[i];
    grads.push_back(g);
  }
  return grads;
}

TEST(AdamWTest, MatchesReferenceOverSeveralSteps) {
  const std::vector<float> params = RandomFloats(1000, 1, -2.0f, 2.0f);
  ops::AdamWArgs hyper;
  hyper.lr = 1e-2f;
  hyper.beta1 = 0.9f;
  hyper.beta2 = 0.98f;
  hyper.eps = 1e-8f;
  hyper.weight_decay = 0.1f;
  hyper.step = 1;
  CheckAdamAgainstReference(hyper, params, RandomGrads(params.size(), 6, 10));
}

TEST(AdamWTest, WithoutWeightDecay) {
  const std::vector<float> params = RandomFloats(257, 2, -1.0f, 1.0f);
  ops::AdamWArgs hyper;
  hyper.lr = 3e-3f;
  hyper.beta1 = 0.8f;
  hyper.beta2 = 0.999f;
  hyper.weight_decay = 0.0f;
  CheckAdamAgainstReference(hyper, params, RandomGrads(params.size(), 5, 20));
}

TEST(AdamWTest, LateStepsAndLargeEps) {
  // From step 1000 on, bias corrections are ~1 (b1^1000 ~ 2e-46) ...
  const std::vector<float> params = RandomFloats(64, 3);
  ops::AdamWArgs hyper;
  hyper.lr = 1e-3f;
  hyper.weight_decay = 0.01f;
  hyper.step = 1000;
  CheckAdamAgainstReference(hyper, params, RandomGrads(params.size(), 3, 30));
  // ... and with gradients ~1e-4 next to eps = 1e-3, eps dominates the denominator, so adding it
  // under the square root (or forgetting the bias correction of v) would change the result.
  hyper.step = 1;
  hyper.eps = 1e-3f;
  CheckAdamAgainstReference(hyper, params, RandomGrads(params.size(), 4, 40, 1e-4f));
}

TEST(AdamWTest, FirstStepMovesEachWeightByLr) {
  // Bias correction makes step 1's update exactly lr sign(g) when |g| >> eps: m_hat = g and
  // v_hat = g^2. Without it the step would be lr (1 - b1) / sqrt(1 - b2) = 0.707 lr.
  const std::vector<float> params = {1.0f, -0.5f, 0.25f, 2.0f};
  const std::vector<float> grads = {0.3f, -2.0f, 1e-3f, -0.7f};
  AdamTensors t = MakeAdamTensors(params);
  NF_ASSERT_OK(CopyFromFloats(t.grads, grads));
  ops::AdamWArgs args{t.params, t.grads, t.exp_avg, t.exp_avg_sq};
  args.lr = 0.01f;
  NF_ASSERT_OK(ops::AdamWStep(args));
  const std::vector<double> p = ToDoubles(t.params);
  for (size_t i = 0; i < p.size(); ++i) {
    const double expected = params[i] - 0.01 * (grads[i] > 0 ? 1 : -1);
    // |g| / (|g| + eps) differs from 1 by <= 1e-5 (g = 1e-3), times lr; plus ~10 fp32 roundings
    // of the update (lr) and one of p (|p| <= 2).
    EXPECT_NEAR(p[i], expected, 0.01 * 1e-5 + 10 * kU32 * 0.01 + 2 * kU32 * 2) << i;
  }
}

TEST(AdamWTest, WeightDecayIsDecoupled) {
  // With zero gradients the moments stay exactly zero -- decay does not pass through them as an
  // L2 term would -- and each step multiplies p by (1 - lr wd).
  const std::vector<float> params = RandomFloats(33, 4, -3.0f, 3.0f);
  AdamTensors t = MakeAdamTensors(params);  // grads are zeros
  ops::AdamWArgs args{t.params, t.grads, t.exp_avg, t.exp_avg_sq};
  args.lr = 0.05f;
  args.weight_decay = 0.2f;
  for (args.step = 1; args.step <= 3; ++args.step) NF_ASSERT_OK(ops::AdamWStep(args));
  const double factor = std::pow(1.0 - static_cast<double>(args.lr) * args.weight_decay, 3);
  const std::vector<double> p = ToDoubles(t.params);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(t.exp_avg.data<float>()[i], 0.0f);
    EXPECT_EQ(t.exp_avg_sq.data<float>()[i], 0.0f);
    // Three steps of 3 fp32 roundings each, plus lr wd rounded once: 10u relative.
    EXPECT_NEAR(p[i], params[i] * factor, 10 * kU32 * std::abs(params[i])) << i;
  }
  // Without decay, zero gradients leave the weights bit-for-bit unchanged.
  AdamTensors still = MakeAdamTensors(params);
  NF_ASSERT_OK(ops::AdamWStep({still.params, still.grads, still.exp_avg, still.exp_avg_sq}));
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(Bits(still.params.data<float>()[i]), Bits(params[i])) << i;
  }
}

TEST(AdamWTest, EmptyAndLengthOne) {
  AdamTensors empty = MakeAdamTensors({});
  NF_EXPECT_OK(ops::AdamWStep({empty.params, empty.grads, empty.exp_avg, empty.exp_avg_sq}));
  ops::AdamWArgs hyper;
  hyper.lr = 0.1f;
  hyper.weight_decay = 0.5f;
  CheckAdamAgainstReference(hyper, {0.75f}, {{-0.2f}, {0.4f}, {0.1f}});
}

TEST(AdamWTest, RejectsInvalidHyperParameters) {
  const std::vector<float> params = {1.0f, 2.0f};
  AdamTensors t = MakeAdamTensors(params);
  NF_ASSERT_OK(CopyFromFloats(t.grads, std::vector<float>{0.5f, -0.5f}));
  const ops::AdamWArgs valid{t.params, t.grads, t.exp_avg, t.exp_avg_sq};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<std::pair<std::string, ops::AdamWArgs>> cases;
  auto with = [&](std::string what, auto edit) {
    ops::AdamWArgs args = valid;
    edit(args);
    cases.emplace_back(std::move(what), args);
  };
  with("step 0", [](auto& a) { a.step = 0; });
  with("step -3", [](auto& a) { a.step = -3; });
  with("beta1 1", [](auto& a) { a.beta1 = 1.0f; });
  with("beta1 -0.1", [](auto& a) { a.beta1 = -0.1f; });
  with("beta1 NaN", [&](auto& a) { a.beta1 = nan; });
  with("beta2 1", [](auto& a) { a.beta2 = 1.0f; });
  with("beta2 1.5", [](auto& a) { a.beta2 = 1.5f; });
  with("beta2 NaN", [&](auto& a) { a.beta2 = nan; });
  with("eps 0", [](auto& a) { a.eps = 0.0f; });
  with("eps -1e-8", [](auto& a) { a.eps = -1e-8f; });
  with("eps NaN", [&](auto& a) { a.eps = nan; });
  with("lr NaN", [&](auto& a) { a.lr = nan; });
  with("lr inf", [&](auto& a) { a.lr = inf; });
  for (const auto& [what, args] : cases) {
    SCOPED_TRACE(what);
    ExpectInvalidArgument(ops::AdamWStep(args), "AdamWStep", "invalid hyper-parameters");
  }
  // Nothing was touched by the rejected calls.
  EXPECT_EQ(ToDoubles(t.params), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(ToDoubles(t.exp_avg), (std::vector<double>{0.0, 0.0}));
}

TEST(AdamWTest, RejectsNonFp32AndMismatchedTensors) {
  AdamTensors t = MakeAdamTensors({1.0f, 2.0f, 3.0f});
  ops::AdamWArgs args{t.params, t.grads, t.exp_avg, t.exp_avg_sq};
  args.grads = MakeZeros(DType::kF16, {3});
  ExpectInvalidArgument(ops::AdamWStep(args), "AdamWStep",
                        "grads is f16[3] on cpu, expected dtype f32");
  args.grads = t.grads;
  args.params = MakeZeros(DType::kBF16, {3});
  ExpectInvalidArgument(ops::AdamWStep(args), "AdamWStep", "params is bf16[3]");
  args.params = t.params;
  args.exp_avg_sq = MakeZeros(DType::kF32, {4});
  ExpectInvalidArgument(ops::AdamWStep(args), "AdamWStep",
                        "exp_avg_sq is f32[4] on cpu, expected shape [3]");
  args.exp_avg_sq = t.exp_avg_sq;
  args.exp_avg = MakeZeros(DType::kF32, {3, 1});
  ExpectInvalidArgument(ops::AdamWStep(args), "AdamWStep", "exp_avg is f32[3, 1]");
  args.exp_avg = Tensor();
  ExpectInvalidArgument(ops::AdamWStep(args), "AdamWStep", "exp_avg is missing");
}

// ---- UnscaleAndCheck ---------------------------------------------------------------------------

Tensor Flag(float value) { return MakeTensor(DType::kF32, {1}, {value}); }
float FlagValue(const Tensor& flag) { return flag.data<float>()[0]; }

TEST(UnscaleAndCheckTest, ScalesFiniteGradientsAndKeepsTheFlag) {
  const std::vector<float> g = RandomFloats(3000, 1, -5000.0f, 5000.0f);
  for (float inv_scale : {1.0f / 65536.0f, 0.3f}) {
    for (float initial_flag : {0.0f, 1.0f}) {
      SCOPED_TRACE(absl::StrCat("inv_scale=", inv_scale, " flag=", initial_flag));
      const Tensor grads = MakeTensor(DType::kF32, {3, 1000}, g);
      const Tensor flag = Flag(initial_flag);
      NF_ASSERT_OK(ops::UnscaleAndCheck(grads, inv_scale, flag));
      // All finite: an unset flag stays unset, a set one stays set.
      EXPECT_EQ(FlagValue(flag), initial_flag);
      std::vector<double> expected;
      for (float v : g) expected.push_back(static_cast<double>(v) * inv_scale);
      // One fp32 product: <= u relative (exact for the power-of-two scale).
      testing::ExpectAllClose(ToDoubles(grads), expected, 0.0, kU32, "grads * inv_scale");
    }
  }
}

TEST(UnscaleAndCheckTest, FlagsInfAndNaNAnywhere) {
  // A large buffer (several thread-pool chunks) with one bad value first, in the middle or last.
  const int64_t n = int64_t{1} << 18;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> base = RandomFloats(n, 2);
  for (float bad : {inf, -inf, nan}) {
    for (int64_t where : {int64_t{0}, n / 2 + 3, n - 1}) {
      SCOPED_TRACE(absl::StrCat("value ", bad, " at ", where));
      std::vector<float> g = base;
      g[where] = bad;
      const Tensor grads = MakeTensor(DType::kF32, {n}, g);
      const Tensor flag = Flag(0.0f);
      NF_ASSERT_OK(ops::UnscaleAndCheck(grads, 0.5f, flag));
      EXPECT_EQ(FlagValue(flag), 1.0f);
      // The finite values are still scaled (exactly, by 1/2) and the bad one stays non-finite.
      const float* out = grads.data<float>();
      EXPECT_EQ(out[(where + 1) % n], 0.5f * g[(where + 1) % n]);
      EXPECT_FALSE(std::isfinite(out[where]));
    }
  }
}

TEST(UnscaleAndCheckTest, FlagsResultsThatBecomeNonFinite) {
  // The check is on the results: a finite value overflowing under the scale, and inf * 0.
  const Tensor big = MakeTensor(DType::kF32, {3}, {1.0f, 3e38f, -2.0f});
  const Tensor flag = Flag(0.0f);
  NF_ASSERT_OK(ops::UnscaleAndCheck(big, 4.0f, flag));
  EXPECT_EQ(FlagValue(flag), 1.0f);
  EXPECT_TRUE(std::isinf(big.data<float>()[1]));

  const Tensor with_inf = MakeTensor(DType::kF32, {2}, {1.0f, INFINITY});
  const Tensor flag2 = Flag(0.0f);
  NF_ASSERT_OK(ops::UnscaleAndCheck(with_inf, 0.0f, flag2));
  EXPECT_EQ(FlagValue(flag2), 1.0f);
  EXPECT_TRUE(std::isnan(with_inf.data<float>()[1]));
}

TEST(UnscaleAndCheckTest, OneFlagCollectsSeveralBuffers) {
  const Tensor flag = Flag(0.0f);
  const Tensor clean1 = MakeTensor(DType::kF32, {4}, {1, 2, 3, 4});
  const Tensor dirty = MakeTensor(DType::kF32, {2}, {NAN, 1});
  const Tensor clean2 = MakeTensor(DType::kF32, {1, 1}, {5});
  NF_ASSERT_OK(ops::UnscaleAndCheck(clean1, 0.5f, flag));
  EXPECT_EQ(FlagValue(flag), 0.0f);
  NF_ASSERT_OK(ops::UnscaleAndCheck(dirty, 0.5f, flag));
  EXPECT_EQ(FlagValue(flag), 1.0f);
  NF_ASSERT_OK(ops::UnscaleAndCheck(clean2, 0.5f, flag));  // a later clean buffer
  EXPECT_EQ(FlagValue(flag), 1.0f);
  EXPECT_EQ(ToDoubles(clean2), std::vector<double>{2.5});
  // An empty buffer changes nothing.
  NF_ASSERT_OK(ops::UnscaleAndCheck(MakeZeros(DType::kF32, {0}), 0.5f, flag));
  EXPECT_EQ(FlagValue(flag), 1.0f);
}

TEST(UnscaleAndCheckTest, RejectsBadArguments) {
  const Tensor flag = Flag(0.0f);
  ExpectInvalidArgument(ops::UnscaleAndCheck(MakeZeros(DType::kF16, {4}), 0.5f, flag),
                        "UnscaleAndCheck", "grads is f16[4] on cpu, expected dtype f32");
  ExpectInvalidArgument(ops::UnscaleAndCheck(MakeZeros(DType::kBF16, {4}), 0.5f, flag),
                        "UnscaleAndCheck", "grads is bf16[4]");
  const Tensor grads = MakeZeros(DType::kF32, {4});
  ExpectInvalidArgument(ops::UnscaleAndCheck(grads, 0.5f, MakeZeros(DType::kF16, {1})),
                        "UnscaleAndCheck", "found_nonfinite is f16[1]");
  ExpectInvalidArgument(ops::UnscaleAndCheck(grads, 0.5f, MakeZeros(DType::kF32, {2})),
                        "UnscaleAndCheck", "found_nonfinite is f32[2] on cpu, expected shape [1]");
  ExpectInvalidArgument(ops::UnscaleAndCheck(grads, 0.5f, MakeZeros(DType::kF32, {})),
                        "UnscaleAndCheck", "expected shape [1]");
}

// ---- SquaredNorm -------------------------------------------------------------------------------

double SumOfSquares(const std::vector<double>& x) {
  double s = 0.0;
  for (double v : x) s += v * v;
  return s;
}

// The CPU backend sums in double (ops.h) and rounds to fp32 twice: the sum, then out + sum. With
// a non-negative starting value that is <= 2u (|out| + sum) = 2u |expected|; double summation of
// n terms adds <= n 2^-53 relative. We allow 4u + n 2^-53 (2x margin). A plain fp32 running sum
// would be off by ~n u / 2 for n positive terms, far outside.
double NormTolerance(double expected, int64_t n) {
  return (4 * kU32 + static_cast<double>(n) * 0x1p-53) * std::abs(expected);
}

TEST(SquaredNormTest, AccumulatesSumOfSquares) {
  uint32_t seed = 10;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<float> x = RandomFloats(3 * 333, ++seed, -3.0f, 3.0f);
    const Tensor tx = MakeTensor(dtype, {3, 333}, x);
    const double sum = SumOfSquares(Rounded(dtype, x));
    const Tensor out = MakeTensor(DType::kF32, {1}, {1.5f});
    NF_ASSERT_OK(ops::SquaredNorm(tx, out));
    EXPECT_NEAR(ToDoubles(out)[0], 1.5 + sum, NormTolerance(1.5 + sum, x.size()));
    // A second call adds again (+=), e.g. the next parameter's contribution.
    NF_ASSERT_OK(ops::SquaredNorm(tx, out));
    // Two calls: twice the per-call bound.
    EXPECT_NEAR(ToDoubles(out)[0], 1.5 + 2 * sum, 2 * NormTolerance(1.5 + 2 * sum, x.size()));
  }
}

TEST(SquaredNormTest, ReducedPrecisionValuesAreReadExactly) {
  // Values exact in fp16 / bf16 whose squares sum exactly in fp32: the result is exact.
  const std::vector<float> x = {1.5f, -0.25f, 3.0f, 0.0f, -2.0f};  // squares: 2.25 + 0.0625 + 9 + 4
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    const Tensor out = MakeZeros(DType::kF32, {1});
    NF_ASSERT_OK(ops::SquaredNorm(MakeTensor(dtype, {5}, x), out));
    EXPECT_EQ(ToDoubles(out)[0], 15.3125) << DTypeName(dtype);
  }
}

TEST(SquaredNormTest, LargeInputIsAccurateAndReproducible) {
  // More than 2^20 elements, an odd count, so the work is split across the thread pool into
  // blocks with a ragged end.
  const int64_t n = (int64_t{1} << 20) + 12345;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<float> x = RandomFloats(n, 7, -1.0f, 1.0f);
    const Tensor tx = MakeTensor(dtype, {n}, x);
    const double expected = SumOfSquares(Rounded(dtype, x));
    uint32_t first_bits = 0;
    for (int repeat = 0; repeat < 3; ++repeat) {
      const Tensor out = MakeZeros(DType::kF32, {1});
      NF_ASSERT_OK(ops::SquaredNorm(tx, out));
      const float result = out.data<float>()[0];
      EXPECT_NEAR(result, expected, NormTolerance(expected, n));
      // Bitwise identical on every call (deterministic block order, whatever the scheduling).
      if (repeat == 0) first_bits = Bits(result);
      EXPECT_EQ(Bits(result), first_bits) << "repeat " << repeat;
    }
  }
}

TEST(SquaredNormTest, NonFiniteAndEdgeCases) {
  const Tensor out = MakeTensor(DType::kF32, {1}, {2.0f});
  NF_ASSERT_OK(ops::SquaredNorm(MakeZeros(DType::kF16, {0, 5}), out));
  EXPECT_EQ(ToDoubles(out)[0], 2.0);  // empty: += 0
  NF_ASSERT_OK(ops::SquaredNorm(MakeTensor(DType::kBF16, {1, 1}, {-3.0f}), out));
  EXPECT_EQ(ToDoubles(out)[0], 11.0);  // length 1: 2 + 9, exact
  // A non-finite value makes the norm non-finite (so gradient clipping sees it).
  const Tensor inf_out = MakeZeros(DType::kF32, {1});
  NF_ASSERT_OK(ops::SquaredNorm(MakeTensor(DType::kF16, {3}, {1.0f, -INFINITY, 2.0f}), inf_out));
  EXPECT_TRUE(std::isinf(ToDoubles(inf_out)[0]));
  const Tensor nan_out = MakeZeros(DType::kF32, {1});
  NF_ASSERT_OK(ops::SquaredNorm(MakeTensor(DType::kF32, {2}, {NAN, 2.0f}), nan_out));
  EXPECT_TRUE(std::isnan(ToDoubles(nan_out)[0]));
}

TEST(SquaredNormTest, RejectsBadArguments) {
  const Tensor x = MakeZeros(DType::kF32, {4});
  ExpectInvalidArgument(ops::SquaredNorm(x, MakeZeros(DType::kF16, {1})), "SquaredNorm",
                        "out is f16[1] on cpu, expected dtype f32");
  ExpectInvalidArgument(ops::SquaredNorm(x, MakeZeros(DType::kBF16, {1})), "SquaredNorm",
                        "out is bf16[1]");
  ExpectInvalidArgument(ops::SquaredNorm(x, MakeZeros(DType::kF32, {2})), "SquaredNorm",
                        "expected shape [1]");
  ExpectInvalidArgument(ops::SquaredNorm(x, MakeZeros(DType::kF32, {1, 1})), "SquaredNorm",
                        "out is f32[1, 1]");
  ExpectInvalidArgument(ops::SquaredNorm(MakeZeros(DType::kI32, {4}), MakeZeros(DType::kF32, {1})),
                        "SquaredNorm", "x is i32[4]");
}

}  // namespace
}  // namespace nf
