// MixedPrecisionAdamW against a float64 AdamW written here: decay and no-decay ranges, padding
// the optimizer must not touch, clipping by clip / norm, skipped steps on non-finite gradients
// and on updates that would overflow the model dtype (checked before anything is written, in
// agreement with the update at the fp16 and bf16 boundaries), fp16 / bf16 model params as the
// rounded fp32 master, the fp32 master aliasing the model,
// checkpoint restore, and the rejections of Create and the stages.
//
// The layout of most tests: 44 elements, ranges [0, 12) decay, [12, 20) no decay, [20, 33) and
// [33, 40) decay (touching: merged), [40, 44) uncovered padding.
#include "core/optim/mixed_precision_optimizer.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/adamw_update.h"
#include "core/allocator.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf::optim {
namespace {

using ::nf::testing::ExpectInvalidArgument;
using ::nf::testing::kU32;
using ::nf::testing::MakeTensor;
using ::nf::testing::MakeZeros;
using ::nf::testing::RandomFloats;
using ::nf::testing::Rounded;
using ::nf::testing::ToDoubles;

constexpr int64_t kNumel = 44;
constexpr float kLossScale = 1024.0f;  // a power of two: scaling and unscaling are exact

constexpr AdamWConfig kConfig{
    .beta1 = 0.9f, .beta2 = 0.98f, .eps = 1e-8f, .weight_decay = 0.1f, .clip_grad = 0.0f};

// Deliberately out of order.
const std::vector<ParamRange> kRanges = {{.offset = 20, .length = 13, .weight_decay = true},
                                         {.offset = 0, .length = 12, .weight_decay = true},
                                         {.offset = 33, .length = 7, .weight_decay = true},
                                         {.offset = 12, .length = 8, .weight_decay = false}};

bool Covered(int64_t i) { return i < 40; }
bool Decays(int64_t i) { return i < 12 || (i >= 20 && i < 40); }

MixedPrecisionAdamW MakeOptimizer(const Tensor& model, const Tensor& grads,
                                  const AdamWConfig& config = kConfig,
                                  std::vector<ParamRange> ranges = kRanges) {
  auto opt = MixedPrecisionAdamW::Create(model, grads, std::move(ranges), config);
  if (!opt.ok()) {
    ADD_FAILURE() << opt.status();
    std::abort();
  }
  const absl::Status init = opt->InitializeMasterFromModel();
  NF_EXPECT_OK(init);
  return *std::move(opt);
}

std::vector<uint8_t> Bytes(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

// Gradients of magnitude [0.1, 1) with a sign fixed per element across steps, so the moments
// accumulate without cancellation (their relative error then stays a few u per step).
std::vector<float> SignedGrads(int step) {
  std::vector<float> g = RandomFloats(kNumel, 100 + step, 0.1f, 1.0f);
  for (size_t i = 0; i < g.size(); i += 3) g[i] = -g[i];
  return g;
}

// Writes g * kLossScale into the covered grads (exact) and `padding` into the rest.
void SetScaledGrads(const Tensor& grads, const std::vector<float>& g, float padding = 7.0f) {
  std::vector<float> scaled(g.size());
  for (size_t i = 0; i < g.size(); ++i) scaled[i] = Covered(i) ? g[i] * kLossScale : padding;
  NF_ASSERT_OK(CopyFromFloats(grads, scaled));
}

// AdamW in double (ops.h's formula), with a running bound on how far an fp32 evaluation of one
// step may drift from it. Per step, for same-sign gradients, first order in u = 2^-24:
//   m = b1 m + (1 - b1) g: 1 - b1 is exact, two products and a sum add <= 3u relative;
//   v = b2 v + (1 - b2) g g: <= 4u relative; so after t steps m is off by <= 3tu, v by <= 4tu.
//   denom = sqrt(v) / sqrt(bc2) + eps: 2tu from v, u for sqrt, 2.5u for bc2 (rounded, square
//   root, reciprocal), u for the product and u for + eps: <= (2t + 5.5)u.
//   update = (lr / bc1) m / denom: 2u for lr / bc1, 2u for product and quotient, plus m's and
//   denom's errors: <= (5t + 9.5)u <= 24.5u for t <= 3; we allow 32u.
//   p -= lr wd p + update: lr wd and its product with p (2u of the decay term), the sum (u of
//   |decay| + |update|) and the difference (u of |p|); we allow 4u of |decay| + |p|.
// Errors carried in p shrink by (1 - lr wd) <= 1 per step, so the bounds add up.
struct Reference {
  std::vector<double> p, m, v, p_bound;

  explicit Reference(const std::vector<double>& params)
      : p(params), m(p.size(), 0.0), v(p.size(), 0.0), p_bound(p.size(), 0.0) {}

  void Step(const std::vector<float>& g, double lr, int64_t t, const AdamWConfig& c) {
    const double b1 = c.beta1, b2 = c.beta2;
    const double bc1 = 1 - std::pow(b1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(b2, static_cast<double>(t));
    for (size_t i = 0; i < p.size(); ++i) {
      if (!Covered(i)) continue;
      const double gi = g[i];
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double update = lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + c.eps);
      const double decay = Decays(i) ? lr * c.weight_decay * p[i] : 0.0;
      p[i] -= decay + update;
      p_bound[i] += 32 * kU32 * std::abs(update) + 4 * kU32 * (std::abs(decay) + std::abs(p[i]));
    }
  }
};

TEST(MixedPrecisionAdamWTest, StepsMatchFloat64AdamW) {
  const std::vector<float> init = RandomFloats(kNumel, 1, -2.0f, 2.0f);
  const Tensor model = MakeTensor(DType::kF32, {kNumel}, init);
  const Tensor grads = MakeZeros(DType::kF32, {kNumel});
  MixedPrecisionAdamW opt = MakeOptimizer(model, grads);
  Reference ref(ToDoubles(model));
  const float lrs[] = {1e-2f, 2e-2f, 1.5e-2f};
  for (int64_t t = 1; t <= 3; ++t) {
    SCOPED_TRACE(absl::StrCat("step ", t));
    const std::vector<float> g = SignedGrads(static_cast<int>(t));
    SetScaledGrads(grads, g);
    const absl::StatusOr<StepResult> result = opt.Step(lrs[t - 1], kLossScale);
    NF_ASSERT_OK(result);
    EXPECT_FALSE(result->skipped);
    EXPECT_EQ(opt.updates(), t);
    double squares = 0.0;
    for (int64_t i = 0; i < kNumel; ++i) squares += Covered(i) ? double{g[i]} * g[i] : 0.0;
    // SquaredNorm sums in double and rounds to fp32 once (u relative); the square root halves
    // that. The padding's 7s would add ~14 to a norm of ~4 if they were counted.
    EXPECT_NEAR(result->grad_norm, std::sqrt(squares), kU32 * std::sqrt(squares));

    ref.Step(g, lrs[t - 1], t, kConfig);
    const std::vector<double> p = ToDoubles(model), m = ToDoubles(opt.exp_avg()),
                              v = ToDoubles(opt.exp_avg_sq()), gr = ToDoubles(grads);
    for (int64_t i = 0; i < kNumel; ++i) {
      if (!Covered(i)) {
        // Padding: never unscaled, never updated.
        EXPECT_EQ(gr[i], 7.0) << i;
        EXPECT_EQ(p[i], init[i]) << i;
        EXPECT_EQ(m[i], 0.0) << i;
        continue;
      }
      // 3tu and 4tu first-order bounds (see Reference), plus u for second-order terms.
      EXPECT_NEAR(m[i], ref.m[i], (3 * t + 1) * kU32 * std::abs(ref.m[i])) << i;
      EXPECT_NEAR(v[i], ref.v[i], (4 * t + 1) * kU32 * std::abs(ref.v[i])) << i;
      EXPECT_NEAR(p[i], ref.p[i], ref.p_bound[i]) << i;
    }
  }
}

TEST(MixedPrecisionAdamWTest, WeightDecaySkipsTheNoDecayRange) {
  // Zero gradients: the Adam part of the update is exactly 0 (m = 0), so decay-range weights
  // shrink by (1 - lr wd) and the others keep their bits.
  const std::vector<float> init = RandomFloats(kNumel, 2, -3.0f, 3.0f);
  const Tensor model = MakeTensor(DType::kF32, {kNumel}, init);
  MixedPrecisionAdamW opt = MakeOptimizer(
      model, MakeZeros(DType::kF32, {kNumel}),
      {.beta1 = 0.9f, .beta2 = 0.98f, .eps = 1e-8f, .weight_decay = 0.2f, .clip_grad = 0.0f});
  NF_ASSERT_OK(opt.Update(0.05f, 0.0));
  const std::vector<double> p = ToDoubles(model);
  for (int64_t i = 0; i < kNumel; ++i) {
    if (Decays(i)) {
      // lr wd rounded, its product with p, the difference: 3u relative.
      EXPECT_NEAR(p[i], init[i] * (1 - 0.05 * 0.2), 3 * kU32 * std::abs(init[i])) << i;
    } else {
      EXPECT_EQ(p[i], init[i]) << i;  // no-decay range and padding
    }
  }
}

TEST(MixedPrecisionAdamWTest, ClippingScalesByClipOverNorm) {
  AdamWConfig config = kConfig;
  config.clip_grad = 1.0f;
  const std::vector<float> g = SignedGrads(1);
  const Tensor model = MakeTensor(DType::kF32, {kNumel}, RandomFloats(kNumel, 3));
  const Tensor grads = MakeTensor(DType::kF32, {kNumel}, g);
  MixedPrecisionAdamW opt = MakeOptimizer(model, grads, config);

  // A norm below the threshold, or clipping off, leaves the grads' bits alone.
  NF_ASSERT_OK(opt.Update(1e-3f, 0.5));
  EXPECT_EQ(ToDoubles(grads), Rounded(DType::kF32, g));
  MixedPrecisionAdamW unclipped = MakeOptimizer(model, grads, kConfig);
  NF_ASSERT_OK(unclipped.Update(1e-3f, 1e6));
  EXPECT_EQ(ToDoubles(grads), Rounded(DType::kF32, g));

  // An (all-reduced) norm of 4 scales the covered grads by 1 / (4 + 1e-6).
  MixedPrecisionAdamW fresh = MakeOptimizer(model, grads, config);
  NF_ASSERT_OK(fresh.Update(1e-3f, 4.0));
  const double coef = 1.0 / (4.0 + 1e-6);
  const std::vector<double> clipped = ToDoubles(grads), m = ToDoubles(fresh.exp_avg());
  for (int64_t i = 0; i < kNumel; ++i) {
    if (!Covered(i)) {
      EXPECT_EQ(clipped[i], g[i]) << i;
      continue;
    }
    const double expected = g[i] * coef;
    // The coefficient rounded to fp32 and the product: two roundings, (1 + u)^2 - 1.
    EXPECT_NEAR(clipped[i], expected, (2 * kU32 + kU32 * kU32) * std::abs(expected)) << i;
    // exp_avg after the first update is (1 - b1) g_clipped: one more rounding.
    const double expected_m = (1 - double{kConfig.beta1}) * expected;
    EXPECT_NEAR(m[i], expected_m, (3 * kU32 + 4 * kU32 * kU32) * std::abs(expected_m)) << i;
  }
}

TEST(MixedPrecisionAdamWTest, StepClipsWithTheNormItComputed) {
  AdamWConfig config = kConfig;
  config.clip_grad = 0.5f;
  const std::vector<float> g = SignedGrads(4);
  const Tensor grads = MakeZeros(DType::kF32, {kNumel});
  MixedPrecisionAdamW opt =
      MakeOptimizer(MakeTensor(DType::kF32, {kNumel}, RandomFloats(kNumel, 4)), grads, config);
  SetScaledGrads(grads, g);
  const absl::StatusOr<StepResult> result = opt.Step(1e-3f, kLossScale);
  NF_ASSERT_OK(result);
  double norm = 0.0, clipped_norm = 0.0;
  const std::vector<double> clipped = ToDoubles(grads);
  for (int64_t i = 0; i < 40; ++i) {
    norm += double{g[i]} * g[i];
    clipped_norm += clipped[i] * clipped[i];
  }
  norm = std::sqrt(norm);
  clipped_norm = std::sqrt(clipped_norm);
  // Reported: the norm before clipping (u relative: one fp32 rounding of the sum, halved by the
  // square root, is u / 2).
  EXPECT_NEAR(result->grad_norm, norm, kU32 * norm);
  // After: clip * norm / (norm + 1e-6). The computed norm (u / 2), the coefficient (u) and each
  // product (u) make <= 2.5u relative; 4u.
  const double expected = 0.5 * norm / (norm + 1e-6);
  EXPECT_NEAR(clipped_norm, expected, 4 * kU32 * expected);
}

TEST(MixedPrecisionAdamWTest, NonFiniteGradSkipsTheStep) {
  const Tensor model = MakeTensor(DType::kBF16, {kNumel}, RandomFloats(kNumel, 5, -2.0f, 2.0f));
  const Tensor grads = MakeZeros(DType::kF32, {kNumel});
  MixedPrecisionAdamW opt = MakeOptimizer(model, grads);
  SetScaledGrads(grads, SignedGrads(1));
  NF_ASSERT_OK(opt.Step(1e-2f, kLossScale));  // moments and master now non-trivial
  const std::vector<uint8_t> model0 = Bytes(model), master0 = Bytes(opt.master()),
                             m0 = Bytes(opt.exp_avg()), v0 = Bytes(opt.exp_avg_sq());
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float bad : {nan, inf, -inf}) {
    for (int64_t where : {int64_t{0}, int64_t{15}, int64_t{39}}) {  // decay, no-decay, last
      SCOPED_TRACE(absl::StrCat(bad, " at ", where));
      std::vector<float> g = SignedGrads(2);
      g[where] = bad;
      SetScaledGrads(grads, g);
      const absl::StatusOr<StepResult> result = opt.Step(1e-2f, kLossScale);
      NF_ASSERT_OK(result);
      EXPECT_TRUE(result->skipped);
      EXPECT_TRUE(std::isnan(result->grad_norm));
      EXPECT_EQ(opt.updates(), 1);
      EXPECT_EQ(Bytes(model), model0);
      EXPECT_EQ(Bytes(opt.master()), master0);
      EXPECT_EQ(Bytes(opt.exp_avg()), m0);
      EXPECT_EQ(Bytes(opt.exp_avg_sq()), v0);
    }
  }
  // Finite gradients whose sum of squares overflows fp32 (40 x 1e40): skipped, norm inf.
  SetScaledGrads(grads, std::vector<float>(kNumel, 1e20f));
  const absl::StatusOr<StepResult> overflow = opt.Step(1e-2f, kLossScale);
  NF_ASSERT_OK(overflow);
  EXPECT_TRUE(overflow->skipped);
  EXPECT_TRUE(std::isinf(overflow->grad_norm));
  EXPECT_EQ(Bytes(opt.master()), master0);
  // A NaN in the padding is none of the optimizer's business.
  SetScaledGrads(grads, SignedGrads(3), nan);
  const absl::StatusOr<StepResult> padded = opt.Step(1e-2f, kLossScale);
  NF_ASSERT_OK(padded);
  EXPECT_FALSE(padded->skipped);
  EXPECT_EQ(opt.updates(), 2);
}

// Without loss scaling Step takes the squared norm's pass as the non-finite check: the same
// results and bytes as the four stages, the same skips and reported norms.
TEST(MixedPrecisionAdamWTest, StepWithoutLossScalingMatchesTheStages) {
  AdamWConfig config = kConfig;
  config.clip_grad = 1.0f;
  const std::vector<float> params = RandomFloats(kNumel, 6, -2.0f, 2.0f);
  const Tensor model = MakeTensor(DType::kF16, {kNumel}, params);
  const Tensor staged_model = MakeTensor(DType::kF16, {kNumel}, params);
  const Tensor grads = MakeZeros(DType::kF32, {kNumel});
  const Tensor staged_grads = MakeZeros(DType::kF32, {kNumel});
  MixedPrecisionAdamW opt = MakeOptimizer(model, grads, config);
  MixedPrecisionAdamW staged = MakeOptimizer(staged_model, staged_grads, config);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Finite steps (the second clipped), then a NaN, an inf, a norm past fp32 and a NaN in the
  // padding.
  std::vector<std::vector<float>> steps = {SignedGrads(1), SignedGrads(2), SignedGrads(3),
                                           SignedGrads(4), std::vector<float>(kNumel, 1e20f)};
  for (float& g : steps[1]) g *= 0.01f;
  steps[2][15] = nan;
  steps[3][39] = -inf;
  for (size_t s = 0; s <= steps.size(); ++s) {
    SCOPED_TRACE(absl::StrCat("step ", s));
    const bool padded = s == steps.size();
    const std::vector<float> g = padded ? SignedGrads(5) : steps[s];
    std::vector<float> with_padding = g;
    for (int64_t i = 40; i < kNumel; ++i) with_padding[i] = padded ? nan : 7.0f;
    NF_ASSERT_OK(CopyFromFloats(grads, with_padding));
    NF_ASSERT_OK(CopyFromFloats(staged_grads, with_padding));
    const absl::StatusOr<StepResult> result = opt.Step(1e-2f, 1.0f);
    NF_ASSERT_OK(result);

    const StepResult expected = [&]() -> StepResult {
      const StepResult skipped{.skipped = true,
                               .reason = SkipReason::kNonFiniteGradients,
                               .grad_norm = std::numeric_limits<double>::quiet_NaN()};
      if (*staged.UnscaleAndCheck(1.0f)) return skipped;
      const double norm = std::sqrt(*staged.SquaredGradNorm());
      if (!std::isfinite(norm))
        return {.skipped = true, .reason = skipped.reason, .grad_norm = norm};
      NF_EXPECT_OK(staged.Update(1e-2f, norm));
      return {.skipped = false, .grad_norm = norm};
    }();
    EXPECT_EQ(result->skipped, expected.skipped);
    EXPECT_EQ(result->reason, expected.reason);
    EXPECT_EQ(std::bit_cast<uint64_t>(result->grad_norm),
              std::bit_cast<uint64_t>(expected.grad_norm));
    EXPECT_EQ(opt.updates(), staged.updates());
    EXPECT_EQ(Bytes(model), Bytes(staged_model));
    EXPECT_EQ(Bytes(grads), Bytes(staged_grads));
    EXPECT_EQ(Bytes(opt.master()), Bytes(staged.master()));
    EXPECT_EQ(Bytes(opt.exp_avg()), Bytes(staged.exp_avg()));
    EXPECT_EQ(Bytes(opt.exp_avg_sq()), Bytes(staged.exp_avg_sq()));
  }
  EXPECT_EQ(opt.updates(), 3);  // the finite steps: all but the NaN, the inf and the 1e20s
}

TEST(MixedPrecisionAdamWTest, ReducedPrecisionModelIsTheRoundedMaster) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<float> init = RandomFloats(kNumel, 6, -2.0f, 2.0f);
    const Tensor model = MakeTensor(dtype, {kNumel}, init);
    const Tensor grads = MakeZeros(DType::kF32, {kNumel});
    MixedPrecisionAdamW opt = MakeOptimizer(model, grads);
    EXPECT_EQ(opt.master().dtype(), DType::kF32);
    EXPECT_FALSE(opt.master().SharesStorageWith(model));
    // fp16 / bf16 values are exact in fp32: the master starts as the model, exactly.
    const std::vector<double> start = ToDoubles(model);
    EXPECT_EQ(ToDoubles(opt.master()), start);
    for (int t = 1; t <= 2; ++t) {
      SetScaledGrads(grads, SignedGrads(t));
      NF_ASSERT_OK(opt.Step(1e-3f, kLossScale));
    }
    const std::vector<double> master = ToDoubles(opt.master()), p = ToDoubles(model);
    std::vector<float> master_floats(master.begin(), master.end());
    const std::vector<double> rounded = Rounded(dtype, master_floats);
    int below_resolution = 0;
    for (int64_t i = 0; i < kNumel; ++i) {
      if (!Covered(i)) {
        EXPECT_EQ(p[i], start[i]) << i;  // padding: untouched in the model too
        continue;
      }
      // Cast rounds to nearest even exactly like TensorFromFloats: bit-for-bit equal.
      EXPECT_EQ(p[i], rounded[i]) << i;
      // Two updates of ~lr = 1e-3 each move every master weight ...
      EXPECT_NE(master[i], start[i]) << i;
      // ... while many are below the model dtype's resolution: the reason for a master copy.
      below_resolution += p[i] == start[i];
    }
    if (dtype == DType::kBF16) {
      EXPECT_GT(below_resolution, 0);
    }
  }
}

TEST(MixedPrecisionAdamWTest, Fp32MasterIsTheModelBuffer) {
  const std::vector<float> init = RandomFloats(kNumel, 7);
  const Tensor model = MakeTensor(DType::kF32, {kNumel}, init);
  const Tensor grads = MakeZeros(DType::kF32, {kNumel});
  MixedPrecisionAdamW opt = MakeOptimizer(model, grads);
  EXPECT_TRUE(opt.master().SharesStorageWith(model));
  EXPECT_EQ(opt.master().raw_data(), model.raw_data());
  EXPECT_EQ(opt.master().shape(), model.shape());
  SetScaledGrads(grads, SignedGrads(1));
  NF_ASSERT_OK(opt.Step(1e-2f, kLossScale));
  const std::vector<double> p = ToDoubles(model);
  for (int64_t i = 0; i < 40; ++i) EXPECT_NE(p[i], init[i]) << i;
}

TEST(MixedPrecisionAdamWTest, MergesTouchingRangesWithTheSameDecayFlag) {
  const Tensor model = MakeZeros(DType::kF32, {kNumel});
  const Tensor grads = MakeZeros(DType::kF32, {kNumel});
  EXPECT_EQ(MakeOptimizer(model, grads).merged_ranges(),
            (std::vector<ParamRange>{{.offset = 0, .length = 12, .weight_decay = true},
                                     {.offset = 12, .length = 8, .weight_decay = false},
                                     {.offset = 20, .length = 20, .weight_decay = true}}));
  // Zero-length ranges vanish; a gap keeps ranges apart even with equal flags.
  std::vector<ParamRange> ranges = {{.offset = 10, .length = 10, .weight_decay = false},
                                    {.offset = 5, .length = 0, .weight_decay = true},
                                    {.offset = 0, .length = 10, .weight_decay = false},
                                    {.offset = 25, .length = 5, .weight_decay = false}};
  EXPECT_EQ(MakeOptimizer(model, grads, kConfig, ranges).merged_ranges(),
            (std::vector<ParamRange>{{.offset = 0, .length = 20, .weight_decay = false},
                                     {.offset = 25, .length = 5, .weight_decay = false}}));
}

TEST(MixedPrecisionAdamWTest, CheckpointRestoreContinuesBitForBit) {
  const std::vector<float> init = RandomFloats(kNumel, 8, -2.0f, 2.0f);
  const Tensor model_a = MakeTensor(DType::kBF16, {kNumel}, init);
  const Tensor grads_a = MakeZeros(DType::kF32, {kNumel});
  MixedPrecisionAdamW a = MakeOptimizer(model_a, grads_a);
  for (int t = 1; t <= 2; ++t) {
    SetScaledGrads(grads_a, SignedGrads(t));
    NF_ASSERT_OK(a.Step(1e-2f, kLossScale));
  }
  // A new optimizer over other buffers, restored from a's state.
  const Tensor model_b = MakeZeros(DType::kBF16, {kNumel});
  const Tensor grads_b = MakeZeros(DType::kF32, {kNumel});
  auto created = MixedPrecisionAdamW::Create(model_b, grads_b, kRanges, kConfig);
  NF_ASSERT_OK(created);
  MixedPrecisionAdamW b = *std::move(created);
  for (auto [from, to] :
       {std::pair{model_a, model_b}, std::pair{a.master(), b.master()},
        std::pair{a.exp_avg(), b.exp_avg()}, std::pair{a.exp_avg_sq(), b.exp_avg_sq()}}) {
    NF_ASSERT_OK(CopyFromFloats(to, *ToFloatVector(from)));
  }
  NF_ASSERT_OK(b.SetUpdates(a.updates()));
  for (int t = 3; t <= 4; ++t) {
    SetScaledGrads(grads_a, SignedGrads(t));
    SetScaledGrads(grads_b, SignedGrads(t));
    NF_ASSERT_OK(a.Step(1e-2f, kLossScale));
    NF_ASSERT_OK(b.Step(1e-2f, kLossScale));
  }
  EXPECT_EQ(b.updates(), 4);
  EXPECT_EQ(Bytes(model_b), Bytes(model_a));
  EXPECT_EQ(Bytes(b.master()), Bytes(a.master()));
  EXPECT_EQ(Bytes(b.exp_avg()), Bytes(a.exp_avg()));
  EXPECT_EQ(Bytes(b.exp_avg_sq()), Bytes(a.exp_avg_sq()));
}

// Reports a device the CPU tensors are not on; never asked for memory.
class OtherDeviceAllocator : public Allocator {
 public:
  Device device() const override { return Device::Cuda(0); }
  absl::StatusOr<void*> Allocate(size_t) override { return absl::InternalError("unused"); }
  void Deallocate(void*, size_t) override {}
};

TEST(MixedPrecisionAdamWTest, CreateRejectsBadBuffersRangesAndConfigs) {
  const Tensor model = MakeZeros(DType::kBF16, {8});
  const Tensor grads = MakeZeros(DType::kF32, {8});
  const std::vector<ParamRange> all = {{.offset = 0, .length = 8, .weight_decay = true}};
  auto create = [&](const Tensor& m, const Tensor& g, std::vector<ParamRange> ranges,
                    const AdamWConfig& config = kConfig) {
    return MixedPrecisionAdamW::Create(m, g, std::move(ranges), config).status();
  };
  const std::string op = "MixedPrecisionAdamW";
  ExpectInvalidArgument(create(MakeZeros(DType::kF32, {2, 4}), grads, all), op,
                        "model_params is f32[2, 4] on cpu, expected a flat 1-D buffer");
  ExpectInvalidArgument(create(MakeZeros(DType::kI32, {8}), grads, all), op,
                        "model_params is i32[8] on cpu, expected a floating dtype");
  ExpectInvalidArgument(create(Tensor(), grads, all), op, "model_params is missing");
  ExpectInvalidArgument(create(model, MakeZeros(DType::kBF16, {8}), all), op,
                        "grads is bf16[8] on cpu, expected dtype f32");
  ExpectInvalidArgument(create(model, MakeZeros(DType::kF32, {9}), all), op,
                        "grads is f32[9] on cpu, expected shape [8]");
  ExpectInvalidArgument(create(model, Tensor(), all), op, "grads is missing");
  ExpectInvalidArgument(create(model, grads,
                               {{.offset = 0, .length = 4, .weight_decay = true},
                                {.offset = 4, .length = 5, .weight_decay = false}}),
                        op, "range 1 (offset 4, length 5) lies outside the 8 elements");
  ExpectInvalidArgument(
      create(model, grads,
             {{.offset = 1, .length = std::numeric_limits<int64_t>::max(), .weight_decay = true}}),
      op, "range 0 (offset 1, length 9223372036854775807) lies outside the 8 elements");
  ExpectInvalidArgument(create(model, grads, {{.offset = -1, .length = 2, .weight_decay = true}}),
                        op, "range 0 has offset -1 and length 2; both must be >= 0");
  ExpectInvalidArgument(create(model, grads, {{.offset = 2, .length = -1, .weight_decay = true}}),
                        op, "range 0 has offset 2 and length -1");
  ExpectInvalidArgument(create(model, grads,
                               {{.offset = 5, .length = 3, .weight_decay = true},
                                {.offset = 2, .length = 4, .weight_decay = false}}),
                        op, "range 1 [2, 6) and range 0 [5, 8) overlap");
  ExpectInvalidArgument(create(model, grads,
                               {{.offset = 0, .length = 8, .weight_decay = true},
                                {.offset = 0, .length = 8, .weight_decay = true}}),
                        op, "range 0 [0, 8) and range 1 [0, 8) overlap");
  OtherDeviceAllocator other;
  ExpectInvalidArgument(MixedPrecisionAdamW::Create(model, grads, all, kConfig, other).status(), op,
                        "the allocator is for cuda:0 but model_params is on cpu");

  std::vector<std::pair<AdamWConfig, std::string>> configs;
  auto with = [&](auto edit, std::string mentions) {
    AdamWConfig config = kConfig;
    edit(config);
    configs.emplace_back(config, std::move(mentions));
  };
  with([](AdamWConfig& c) { c.beta1 = 1.0f; }, "beta1 must be in [0, 1), got 1");
  with([](AdamWConfig& c) { c.beta2 = -0.5f; }, "beta2 must be in [0, 1), got -0.5");
  with([](AdamWConfig& c) { c.beta2 = NAN; }, "beta2 must be in [0, 1)");
  with([](AdamWConfig& c) { c.eps = 0.0f; }, "eps must be finite and > 0, got 0");
  with([](AdamWConfig& c) { c.weight_decay = -0.1f; }, "weight_decay must be finite and >= 0");
  with([](AdamWConfig& c) { c.clip_grad = -1.0f; }, "clip_grad must be finite and >= 0");
  with([](AdamWConfig& c) { c.clip_grad = INFINITY; }, "clip_grad must be finite");
  for (const auto& [config, mentions] : configs) {
    SCOPED_TRACE(mentions);
    ExpectInvalidArgument(create(model, grads, all, config), "AdamWConfig", mentions);
  }
}

TEST(MixedPrecisionAdamWTest, StagesRejectBadArgumentsAndChangeNothing) {
  const Tensor model = MakeTensor(DType::kF16, {kNumel}, RandomFloats(kNumel, 9));
  const Tensor grads = MakeTensor(DType::kF32, {kNumel}, SignedGrads(1));
  MixedPrecisionAdamW opt = MakeOptimizer(model, grads);
  const std::vector<uint8_t> model0 = Bytes(model), grads0 = Bytes(grads),
                             master0 = Bytes(opt.master());
  const std::string op = "MixedPrecisionAdamW";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (float scale : {0.0f, -2.0f, inf, nan}) {
    ExpectInvalidArgument(opt.UnscaleAndCheck(scale).status(), op,
                          "loss_scale must be finite and > 0");
    ExpectInvalidArgument(opt.Step(1e-3f, scale).status(), op, "loss_scale must be finite");
  }
  for (float lr : {-1e-3f, inf, nan}) {
    ExpectInvalidArgument(opt.Update(lr, 1.0), op, "Update: lr must be finite and >= 0");
  }
  for (double norm : {-1.0, double{inf}, double{nan}}) {
    ExpectInvalidArgument(opt.Update(1e-3f, norm), op, "Update: grad_norm must be finite");
  }
  ExpectInvalidArgument(opt.SetUpdates(-1), op, "SetUpdates: updates must be >= 0, got -1");
  EXPECT_EQ(opt.updates(), 0);
  EXPECT_EQ(Bytes(model), model0);
  EXPECT_EQ(Bytes(grads), grads0);
  EXPECT_EQ(Bytes(opt.master()), master0);
}

// Every buffer the optimizer owns or writes, as bytes.
struct Snapshot {
  std::vector<uint8_t> model, grads, master, exp_avg, exp_avg_sq;
  int64_t updates;

  static Snapshot Of(const MixedPrecisionAdamW& opt) {
    return {Bytes(opt.model_params()), Bytes(opt.grads()),      Bytes(opt.master()),
            Bytes(opt.exp_avg()),      Bytes(opt.exp_avg_sq()), opt.updates()};
  }
  void ExpectUnchanged(const MixedPrecisionAdamW& opt) const {
    EXPECT_EQ(Bytes(opt.model_params()), model);
    EXPECT_EQ(Bytes(opt.grads()), grads);
    EXPECT_EQ(Bytes(opt.master()), master);
    EXPECT_EQ(Bytes(opt.exp_avg()), exp_avg);
    EXPECT_EQ(Bytes(opt.exp_avg_sq()), exp_avg_sq);
    EXPECT_EQ(opt.updates(), updates);
  }
};

// The finding this guards against: an fp16 update with lr 1e6 pushed weights of ~1 to ~1e6,
// past fp16's 65504, and the model's copies became inf while the step counted as taken.
TEST(MixedPrecisionAdamWTest, UpdateThatWouldOverflowTheModelDTypeSkipsTheStep) {
  for (const float clip : {0.0f, 0.5f}) {  // the check must clip like Update, without writing
    SCOPED_TRACE(absl::StrCat("clip_grad ", clip));
    AdamWConfig config = kConfig;
    config.clip_grad = clip;
    const Tensor model = MakeTensor(DType::kF16, {kNumel}, RandomFloats(kNumel, 11, -2.0f, 2.0f));
    const Tensor grads = MakeZeros(DType::kF32, {kNumel});
    MixedPrecisionAdamW opt = MakeOptimizer(model, grads, config);

    // A normal step: checked, not skipped, applied.
    SetScaledGrads(grads, SignedGrads(1));
    const Snapshot before_normal = Snapshot::Of(opt);
    const absl::StatusOr<StepResult> normal = opt.Step(1e-2f, kLossScale);
    NF_ASSERT_OK(normal);
    EXPECT_FALSE(normal->skipped);
    EXPECT_EQ(normal->reason, SkipReason::kNone);
    EXPECT_EQ(opt.updates(), 1);
    EXPECT_NE(Bytes(opt.model_params()), before_normal.model);
    EXPECT_NE(Bytes(opt.master()), before_normal.master);

    // lr 1e6: every weight would move by ~1e6. Skipped, for that reason, and nothing moved.
    SetScaledGrads(grads, SignedGrads(2));
    const Snapshot before = Snapshot::Of(opt);
    const absl::StatusOr<StepResult> huge = opt.Step(1e6f, kLossScale);
    NF_ASSERT_OK(huge);
    EXPECT_TRUE(huge->skipped);
    EXPECT_EQ(huge->reason, SkipReason::kUpdateOverflow);
    EXPECT_EQ(SkipReasonName(huge->reason), "update_overflow");
    EXPECT_TRUE(std::isfinite(huge->grad_norm));  // the gradients were fine
    EXPECT_EQ(Bytes(opt.model_params()), before.model);
    EXPECT_EQ(Bytes(opt.master()), before.master);
    EXPECT_EQ(Bytes(opt.exp_avg()), before.exp_avg);
    EXPECT_EQ(Bytes(opt.exp_avg_sq()), before.exp_avg_sq);
    EXPECT_EQ(opt.updates(), 1);
    for (const double p : ToDoubles(opt.model_params())) EXPECT_TRUE(std::isfinite(p));

    // The stage alone writes nothing at all, grads included (no in-place clipping), and says
    // the same with the norm a distributed caller would pass.
    const Snapshot stage = Snapshot::Of(opt);
    const absl::StatusOr<bool> would = opt.UpdateWouldOverflow(1e6f, huge->grad_norm);
    NF_ASSERT_OK(would);
    EXPECT_TRUE(*would);
    stage.ExpectUnchanged(opt);
    const absl::StatusOr<bool> fine = opt.UpdateWouldOverflow(1e-2f, huge->grad_norm);
    NF_ASSERT_OK(fine);
    EXPECT_FALSE(*fine);
    stage.ExpectUnchanged(opt);

    // And the next normal step goes through.
    SetScaledGrads(grads, SignedGrads(3));
    const absl::StatusOr<StepResult> after = opt.Step(1e-2f, kLossScale);
    NF_ASSERT_OK(after);
    EXPECT_FALSE(after->skipped);
    EXPECT_EQ(opt.updates(), 2);
  }
}

TEST(MixedPrecisionAdamWTest, UpdateOverflowIsPerModelDType) {
  // bf16 holds 1e6 easily; its limit (~3.4e38) takes an lr near fp32's own.
  {
    const Tensor model = MakeTensor(DType::kBF16, {kNumel}, RandomFloats(kNumel, 12, -2.0f, 2.0f));
    const Tensor grads = MakeTensor(DType::kF32, {kNumel}, SignedGrads(1));
    MixedPrecisionAdamW opt = MakeOptimizer(model, grads);
    const Snapshot before = Snapshot::Of(opt);
    const absl::StatusOr<bool> million = opt.UpdateWouldOverflow(1e6f, 1.0);
    NF_ASSERT_OK(million);
    EXPECT_FALSE(*million);
    // lr / (1 - b1) = 1e38 / 0.1 overflows fp32 in the step size itself.
    const absl::StatusOr<bool> huge = opt.UpdateWouldOverflow(1e38f, 1.0);
    NF_ASSERT_OK(huge);
    EXPECT_TRUE(*huge);
    before.ExpectUnchanged(opt);
  }
  // fp32 models: the master is the model; a non-finite new master is the overflow.
  {
    const Tensor model = MakeTensor(DType::kF32, {kNumel}, RandomFloats(kNumel, 13, -2.0f, 2.0f));
    const Tensor grads = MakeZeros(DType::kF32, {kNumel});
    MixedPrecisionAdamW opt = MakeOptimizer(model, grads);
    SetScaledGrads(grads, SignedGrads(1));
    const Snapshot before_huge = Snapshot::Of(opt);
    const absl::StatusOr<StepResult> huge = opt.Step(1e38f, kLossScale);
    NF_ASSERT_OK(huge);
    EXPECT_TRUE(huge->skipped);
    EXPECT_EQ(huge->reason, SkipReason::kUpdateOverflow);
    EXPECT_EQ(Bytes(opt.master()), before_huge.master);
    EXPECT_EQ(opt.updates(), 0);
    const absl::StatusOr<bool> fine = opt.UpdateWouldOverflow(1e6f, huge->grad_norm);
    NF_ASSERT_OK(fine);
    EXPECT_FALSE(*fine);  // 1e6 is nothing to fp32
  }
  // The stage's arguments are checked like Update's.
  const Tensor model = MakeTensor(DType::kF16, {kNumel}, RandomFloats(kNumel, 14));
  const Tensor grads = MakeTensor(DType::kF32, {kNumel}, SignedGrads(1));
  MixedPrecisionAdamW opt = MakeOptimizer(model, grads);
  const float inf = std::numeric_limits<float>::infinity();
  ExpectInvalidArgument(opt.UpdateWouldOverflow(-1.0f, 1.0).status(), "MixedPrecisionAdamW",
                        "UpdateWouldOverflow: lr must be finite and >= 0");
  ExpectInvalidArgument(opt.UpdateWouldOverflow(1e-3f, double{inf}).status(), "MixedPrecisionAdamW",
                        "UpdateWouldOverflow: grad_norm must be finite");
}

// The check compares against one threshold per model dtype; it must be exactly where the
// model's cast (ops::Cast: round to nearest even) starts giving inf.
TEST(MixedPrecisionAdamWTest, OverflowThresholdIsWhereTheCastGivesInf) {
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const float t = AdamWOverflowThreshold(dtype);
    const float below = std::nextafter(t, 0.0f);
    const std::vector<double> cast = Rounded(dtype, {t, -t, below, -below});
    EXPECT_TRUE(std::isinf(cast[0]) && cast[0] > 0);
    EXPECT_TRUE(std::isinf(cast[1]) && cast[1] < 0);
    EXPECT_TRUE(std::isfinite(cast[2])) << below;
    EXPECT_TRUE(std::isfinite(cast[3])) << -below;
  }
  EXPECT_TRUE(std::isinf(AdamWOverflowThreshold(DType::kF32)));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(AdamWElementOverflows({nan, 0.0f, 0.0f}, 65520.0f));
  EXPECT_TRUE(AdamWElementOverflows({0.0f, inf, 0.0f}, 65520.0f));
  EXPECT_TRUE(AdamWElementOverflows({0.0f, 0.0f, nan}, 65520.0f));
  EXPECT_FALSE(AdamWElementOverflows({-65519.99f, 3e38f, 3e38f}, 65520.0f));
  EXPECT_TRUE(AdamWElementOverflows({inf, 0.0f, 0.0f}, inf));
}

// One element whose master starts at `start` (written directly, as a checkpoint restore does)
// and whose single AdamW step moves it by lr in the direction of -grad: at step 1 with
// m = (1 - b1) g and v = (1 - b2) g^2 the step is lr (1 + O(1e-7)), which fp32 rounds to
// exactly one grid step when lr is one ulp of the result (or 1 at 65504, where the ulp is
// 1/256). Returns (UpdateWouldOverflow, then after Update: the master, the model as float).
struct BoundaryCase {
  bool would_overflow;
  float master, model;
};

BoundaryCase StepOneElement(DType dtype, float start, float grad, float lr) {
  const AdamWConfig config = {
      .beta1 = 0.9f, .beta2 = 0.98f, .eps = 1e-8f, .weight_decay = 0.0f, .clip_grad = 0.0f};
  const Tensor model = MakeZeros(dtype, {1});
  const Tensor grads = MakeTensor(DType::kF32, {1}, {grad});
  MixedPrecisionAdamW opt =
      MakeOptimizer(model, grads, config, {{.offset = 0, .length = 1, .weight_decay = false}});
  NF_EXPECT_OK(CopyFromFloats(opt.master(), std::vector<float>{start}));
  BoundaryCase result{};
  const absl::StatusOr<bool> would = opt.UpdateWouldOverflow(lr, std::abs(grad));
  NF_EXPECT_OK(would);
  result.would_overflow = would.ok() && *would;
  NF_EXPECT_OK(opt.Update(lr, std::abs(grad)));
  result.master = static_cast<float>(ToDoubles(opt.master())[0]);
  result.model = static_cast<float>(ToDoubles(opt.model_params())[0]);
  return result;
}

TEST(MixedPrecisionAdamWTest, OverflowCheckAgreesWithTheUpdateAtTheBoundary) {
  const float largest_half = 65504.0f;
  const float half_inf_from = 65520.0f;  // halfway to 2^16: rounds (to even) up to inf
  const float below = std::nextafter(half_inf_from, 0.0f);
  struct Case {
    DType dtype;
    float start, grad, lr;
    float master;  // where the update lands, exactly
    bool overflow;
  };
  // bf16: largest finite 0x7F7F0000; 0x7F7F8000 is halfway to 2^128 and rounds (to even) to
  // inf; the fp32 ulp there is 2^104.
  const auto bits = [](uint32_t b) { return std::bit_cast<float>(b); };
  const float ulp = 0x1p104f;
  const std::vector<Case> cases = {
      {DType::kF16, largest_half - 1, -1.0f, 1.0f, largest_half, false},
      {DType::kF16, below - 1, -1.0f, 1.0f, below, false},  // the model rounds it to 65504
      {DType::kF16, half_inf_from - 1, -1.0f, 1.0f, half_inf_from, true},
      {DType::kF16, -(largest_half - 1), 1.0f, 1.0f, -largest_half, false},
      {DType::kF16, -(half_inf_from - 1), 1.0f, 1.0f, -half_inf_from, true},
      {DType::kBF16, bits(0x7F7EFFFFu), -1.0f, ulp, bits(0x7F7F0000u), false},
      {DType::kBF16, bits(0x7F7F7FFEu), -1.0f, ulp, bits(0x7F7F7FFFu), false},
      {DType::kBF16, bits(0x7F7F7FFFu), -1.0f, ulp, bits(0x7F7F8000u), true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(DTypeName(c.dtype), " from ", c.start, " to ", c.master));
    const BoundaryCase got = StepOneElement(c.dtype, c.start, c.grad, c.lr);
    ASSERT_EQ(got.master, c.master);  // the case lands where it says
    EXPECT_EQ(got.would_overflow, c.overflow);
    // What the check said is what the update did to the model.
    EXPECT_EQ(got.would_overflow, std::isinf(got.model)) << got.model;
    if (!c.overflow) {
      EXPECT_EQ(std::abs(got.model), c.dtype == DType::kF16 ? largest_half : bits(0x7F7F0000u));
    }
  }
}

}  // namespace
}  // namespace nf::optim
