// The vectorised optimizer kernels (core/cpu/isa/optimizer_kernels.h) at every ISA level this CPU
// runs. AdamW's update must be AdamWUpdateElement (core/adamw_update.h, the CUDA kernel's
// arithmetic) bit for bit at every level, and the overflow check must judge exactly the values
// the update writes; unscaling is one fp32 product per element; squared norms are compared
// across levels bit for bit and against a float64 sum.
//
// Lengths exercise the vector loops and their tails (0, 1, 7, 16, 37, 1000 + 3), and the arrays
// start one element into their buffers, so no level may assume aligned input.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/adamw_update.h"
#include "core/cpu/isa/optimizer_kernels.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf::cpu {
namespace {

using ::nf::testing::RandomFloats;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const std::vector<int64_t> kLengths = {0, 1, 7, 16, 37, 1003};

AdamWKernelConstants KernelConstants(const AdamWConstants& k) {
  return {k.beta1, k.beta2, k.eps, k.step_size, k.inv_sqrt_bias_correction2, k.decay};
}

// A few hyper-parameter sets: a first step (bias corrections far from 1), a late one, strong
// decay and a large eps, and a huge step size (updates far past fp16's range).
std::vector<AdamWConstants> ConstantSets() {
  return {MakeAdamWConstants(1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1),
          MakeAdamWConstants(6e-4f, 0.9f, 0.95f, 1e-8f, 0.01f, 5000),
          MakeAdamWConstants(0.3f, 0.5f, 0.6f, 1e-2f, 2.0f, 3),
          MakeAdamWConstants(1e6f, 0.8f, 0.99f, 1e-30f, 0.0f, 2)};
}

// Optimizer state of n elements (each array with one leading element the kernels never see):
// random values across many magnitudes, with zeros, subnormals, signed zeros and values near
// fp16's and fp32's limits mixed in.
struct State {
  std::vector<float> p, g, m, v;
};

// Zeros but for element i of s (zeros update to zeros, so only that element can overflow).
State OnlyElement(const State& s, int64_t i) {
  const std::vector<float> zeros(s.p.size(), 0.0f);
  State one{zeros, zeros, zeros, zeros};
  one.p[i] = s.p[i];
  one.g[i] = s.g[i];
  one.m[i] = s.m[i];
  one.v[i] = s.v[i];
  return one;
}

std::vector<float> Spread(int64_t n, uint32_t seed, bool non_negative) {
  std::vector<float> x = RandomFloats(n + 1, seed, non_negative ? 0.0f : -1.0f, 1.0f);
  const std::vector<float> exponent = RandomFloats(n + 1, seed + 100, -30.0f, 30.0f);
  const float specials[] = {0.0f, -0.0f, 1e-40f, 65504.0f, 3e38f, 1e20f, 1.0f};
  for (int64_t i = 0; i <= n; ++i) {
    x[i] *= std::exp2(std::round(exponent[i]));
    if (i % 11 == 5) x[i] = specials[(i / 11) % 7];
    if (non_negative) x[i] = std::fabs(x[i]);
  }
  return x;
}

State RandomState(int64_t n, uint32_t seed) {
  return {Spread(n, seed, false), Spread(n, seed + 1, false), Spread(n, seed + 2, false),
          Spread(n, seed + 3, true)};
}

TEST(OptimizerKernelsTest, AdamWStepIsTheElementFunctionBitForBit) {
  for (Isa isa : RunnableIsas()) {
    const OptimizerKernels& kernels = OptimizerKernelsFor(isa);
    for (const AdamWConstants& k : ConstantSets()) {
      for (int64_t n : kLengths) {
        SCOPED_TRACE(absl::StrCat(IsaName(isa), " n=", n, " step_size=", k.step_size));
        State s = RandomState(n, static_cast<uint32_t>(n) + 1);
        const State before = s;
        kernels.adamw_step(s.p.data() + 1, s.g.data() + 1, s.m.data() + 1, s.v.data() + 1, n,
                           KernelConstants(k));
        EXPECT_EQ(s.g, before.g);  // read only (no NaN among the inputs)
        for (int64_t i = 1; i <= n; ++i) {
          const AdamWElement e =
              AdamWUpdateElement(k, before.p[i], before.g[i], before.m[i], before.v[i]);
          ASSERT_EQ(std::bit_cast<uint32_t>(s.p[i]), std::bit_cast<uint32_t>(e.param)) << i;
          ASSERT_EQ(std::bit_cast<uint32_t>(s.m[i]), std::bit_cast<uint32_t>(e.exp_avg)) << i;
          ASSERT_EQ(std::bit_cast<uint32_t>(s.v[i]), std::bit_cast<uint32_t>(e.exp_avg_sq)) << i;
        }
        EXPECT_EQ(std::bit_cast<uint32_t>(s.p[0]), std::bit_cast<uint32_t>(before.p[0]));
      }
    }
  }
}

// The check agrees with AdamWElementOverflows on the element function's values, for fp16's,
// bf16's and fp32's thresholds and with a grad scale (the clipping factor).
TEST(OptimizerKernelsTest, AdamWWouldOverflowMatchesTheElementPredicate) {
  for (Isa isa : RunnableIsas()) {
    const OptimizerKernels& kernels = OptimizerKernelsFor(isa);
    for (const AdamWConstants& k : ConstantSets()) {
      for (DType model : {DType::kF16, DType::kBF16, DType::kF32}) {
        for (float grad_scale : {1.0f, 0.37f}) {
          const float threshold = AdamWOverflowThreshold(model);
          // One element at a time at each position of a benign array (zeros update to zeros),
          // so every lane of the vector loop and of the tail is asked about every value.
          const int64_t n = 37;
          const State s = RandomState(n, 7);
          for (int64_t i = 1; i <= n; ++i) {
            SCOPED_TRACE(absl::StrCat(IsaName(isa), " ", DTypeName(model), " scale ", grad_scale,
                                      " element ", i));
            const State one = OnlyElement(s, i);
            const bool expected = AdamWElementOverflows(
                AdamWUpdateElement(k, s.p[i], grad_scale * s.g[i], s.m[i], s.v[i]), threshold);
            EXPECT_EQ(kernels.adamw_would_overflow(one.p.data() + 1, one.g.data() + 1,
                                                   one.m.data() + 1, one.v.data() + 1, n,
                                                   KernelConstants(k), grad_scale, threshold),
                      expected);
          }
        }
      }
    }
  }
}

// The check computes exactly the param the step writes: with the threshold at that param's
// magnitude it must fire, one float above it must not. Any other value computed by the check
// (another rounding, a contracted multiply-add) would fail one of the two.
TEST(OptimizerKernelsTest, AdamWWouldOverflowSeesTheStepsBits) {
  for (Isa isa : RunnableIsas()) {
    const OptimizerKernels& kernels = OptimizerKernelsFor(isa);
    for (const AdamWConstants& k : ConstantSets()) {
      const int64_t n = 37;
      // Moderate magnitudes: every moment stays finite, so only the threshold decides.
      const State s = {RandomFloats(n + 1, 1, -100.0f, 100.0f), RandomFloats(n + 1, 2),
                       RandomFloats(n + 1, 3), RandomFloats(n + 1, 4, 0.0f, 1.0f)};
      State stepped = s;
      kernels.adamw_step(stepped.p.data(), stepped.g.data(), stepped.m.data(), stepped.v.data(),
                         n + 1, KernelConstants(k));
      for (int64_t i = 1; i <= n; ++i) {
        SCOPED_TRACE(absl::StrCat(IsaName(isa), " element ", i, " p_new ", stepped.p[i]));
        const State one = OnlyElement(s, i);
        const float at = std::fabs(stepped.p[i]);
        if (at == 0.0f) continue;  // zeros elsewhere would fire at threshold 0 too
        auto fires = [&](float threshold) {
          return kernels.adamw_would_overflow(one.p.data() + 1, one.g.data() + 1, one.m.data() + 1,
                                              one.v.data() + 1, n, KernelConstants(k), 1.0f,
                                              threshold);
        };
        EXPECT_TRUE(fires(at));
        EXPECT_FALSE(fires(std::nextafter(at, kInf)));
      }
    }
  }
}

TEST(OptimizerKernelsTest, AdamWWouldOverflowFlagsNonFiniteMomentsAnywhere) {
  const AdamWConstants k = ConstantSets()[0];
  const int64_t n = 1003;
  for (Isa isa : RunnableIsas()) {
    for (int64_t where : {int64_t{0}, int64_t{17}, n - 1}) {
      SCOPED_TRACE(absl::StrCat(IsaName(isa), " at ", where));
      std::vector<float> p(n, 1.0f), g(n, 0.5f), m(n, 0.1f), v(n, 0.01f);
      auto check = [&] {
        return OptimizerKernelsFor(isa).adamw_would_overflow(p.data(), g.data(), m.data(), v.data(),
                                                             n, KernelConstants(k), 1.0f, kInf);
      };
      EXPECT_FALSE(check());
      g[where] = 1e21f;  // finite, but (1 - beta2) g g overflows exp_avg_sq
      EXPECT_TRUE(check());
      g[where] = 0.5f;
      m[where] = kNaN;
      EXPECT_TRUE(check());
    }
  }
}

TEST(OptimizerKernelsTest, UnscaleAndCheckIsOneProductPerElement) {
  for (Isa isa : RunnableIsas()) {
    for (float inv_scale : {1.0f, 0.5f, 0.3f, 1.0f / 65536.0f}) {
      for (int64_t n : kLengths) {
        SCOPED_TRACE(absl::StrCat(IsaName(isa), " inv_scale ", inv_scale, " n=", n));
        std::vector<float> g = Spread(n, 5, false);
        const std::vector<float> before = g;
        EXPECT_FALSE(OptimizerKernelsFor(isa).unscale_and_check(g.data() + 1, n, inv_scale));
        for (int64_t i = 1; i <= n; ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(g[i]), std::bit_cast<uint32_t>(before[i] * inv_scale))
              << i;
        }
        EXPECT_EQ(g[0], before[0]);
      }
    }
  }
}

TEST(OptimizerKernelsTest, UnscaleAndCheckFlagsNonFiniteResultsInEveryLane) {
  const int64_t n = 37;
  for (Isa isa : RunnableIsas()) {
    // inv_scale 1 takes the read-only path; 4 also overflows a finite 1e38.
    for (float inv_scale : {1.0f, 4.0f}) {
      for (float bad : {kInf, -kInf, kNaN, 1e38f}) {
        if (inv_scale == 1.0f && std::isfinite(bad)) continue;
        for (int64_t where = 0; where < n; ++where) {
          SCOPED_TRACE(absl::StrCat(IsaName(isa), " ", bad, " at ", where, " scale ", inv_scale));
          std::vector<float> g = RandomFloats(n, 9);
          g[where] = bad;
          EXPECT_TRUE(OptimizerKernelsFor(isa).unscale_and_check(g.data(), n, inv_scale));
        }
      }
    }
  }
}

TEST(OptimizerKernelsTest, SquaredNormAgreesAcrossLevelsAndWithFloat64) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{1003},
                    int64_t{1} << 14}) {
    const std::vector<float> x = RandomFloats(n + 1, static_cast<uint32_t>(n) + 3, -4.0f, 4.0f);
    double expected = 0.0;
    for (int64_t i = 1; i <= n; ++i) expected += static_cast<double>(x[i]) * x[i];
    const double baseline = OptimizerKernelsFor(Isa::kBaseline).squared_norm(x.data() + 1, n);
    // Every square is exact in double; n additions round by at most n 2^-53 relative.
    EXPECT_NEAR(baseline, expected, static_cast<double>(n) * 0x1p-53 * expected) << n;
    for (Isa isa : RunnableIsas()) {
      EXPECT_EQ(std::bit_cast<uint64_t>(OptimizerKernelsFor(isa).squared_norm(x.data() + 1, n)),
                std::bit_cast<uint64_t>(baseline))
          << IsaName(isa) << " n=" << n;
    }
  }
}

TEST(OptimizerKernelsTest, SquaredNormPropagatesNonFiniteValues) {
  for (Isa isa : RunnableIsas()) {
    std::vector<float> x(37, 1.0f);
    x[20] = -kInf;
    EXPECT_EQ(OptimizerKernelsFor(isa).squared_norm(x.data(), 37), kInf) << IsaName(isa);
    x[3] = kNaN;
    EXPECT_TRUE(std::isnan(OptimizerKernelsFor(isa).squared_norm(x.data(), 37))) << IsaName(isa);
  }
}

}  // namespace
}  // namespace nf::cpu
