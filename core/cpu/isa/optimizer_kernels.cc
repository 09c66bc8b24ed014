// Compiled once per ISA level (nf_add_isa_sources), with -ffp-contract=off and -fno-math-errno
// (core/CMakeLists.txt): see optimizer_kernels.h. No FMA keeps every level's AdamW bits those of
// AdamWUpdateElement; without errno, sqrtf is the vector square root (the same correctly rounded
// result, minus a library call the vectoriser cannot see through).
#include "core/cpu/isa/optimizer_kernels.h"

#include <cmath>
#include <cstdint>

#include "core/cpu/isa/lanes.h"

namespace nf::cpu::NF_ISA_NAMESPACE {
namespace {

constexpr float kFloatMax = 0x1.fffffep127f;

struct Updated {
  float param, exp_avg, exp_avg_sq;
};

// AdamWUpdateElement (core/adamw_update.h), operation for operation: the step and the check
// both call this one function, so the check judges exactly the values the step writes.
inline Updated UpdateElement(const AdamWKernelConstants& k, float p, float g, float m, float v) {
  const float m_new = k.beta1 * m + (1.0f - k.beta1) * g;
  const float v_new = k.beta2 * v + (1.0f - k.beta2) * g * g;
  const float denom = std::sqrt(v_new) * k.inv_sqrt_bias_correction2 + k.eps;
  return {p - (k.decay * p + k.step_size * m_new / denom), m_new, v_new};
}

// AdamWElementOverflows as 0 or 1 (an integer the vectoriser ORs across lanes).
inline uint32_t Overflows(const Updated& e, float threshold) {
  return static_cast<uint32_t>(!(std::fabs(e.param) < threshold)) |
         static_cast<uint32_t>(!(std::fabs(e.exp_avg) <= kFloatMax)) |
         static_cast<uint32_t>(!(std::fabs(e.exp_avg_sq) <= kFloatMax));
}

inline uint32_t NonFinite(float x) { return static_cast<uint32_t>(!(std::fabs(x) <= kFloatMax)); }

void AdamWStep(float* __restrict p, const float* __restrict g, float* __restrict m,
               float* __restrict v, int64_t n, const AdamWKernelConstants& k) {
  for (int64_t i = 0; i < n; ++i) {
    const Updated e = UpdateElement(k, p[i], g[i], m[i], v[i]);
    p[i] = e.param;
    m[i] = e.exp_avg;
    v[i] = e.exp_avg_sq;
  }
}

bool AdamWWouldOverflow(const float* __restrict p, const float* __restrict g,
                        const float* __restrict m, const float* __restrict v, int64_t n,
                        const AdamWKernelConstants& k, float grad_scale, float threshold) {
  uint32_t overflow = 0;
  for (int64_t i = 0; i < n; ++i) {
    // grad_scale * g rounds exactly as the in-place scaling before the step does.
    overflow |= Overflows(UpdateElement(k, p[i], grad_scale * g[i], m[i], v[i]), threshold);
  }
  return overflow != 0;
}

bool AnyNonFinite(const float* g, int64_t n) {
  uint32_t nonfinite = 0;
  for (int64_t i = 0; i < n; ++i) nonfinite |= NonFinite(g[i]);
  return nonfinite != 0;
}

bool UnscaleAndCheck(float* g, int64_t n, float inv_scale) {
  // Multiplying by 1 changes no value (the scale of every run without loss scaling): only read.
  if (inv_scale == 1.0f) return AnyNonFinite(g, n);
  uint32_t nonfinite = 0;
  for (int64_t i = 0; i < n; ++i) {
    g[i] *= inv_scale;
    nonfinite |= NonFinite(g[i]);
  }
  return nonfinite != 0;
}

// In lanes.h's fixed lanes and tree, which do not depend on the level: the same bits at every one.
double SquaredNorm(const float* x, int64_t n) {
  return LaneSum(n, [x](int64_t i) {
    const double value = x[i];
    return value * value;
  });
}

}  // namespace

const OptimizerKernels kOptimizerKernels = {
    .adamw_step = AdamWStep,
    .adamw_would_overflow = AdamWWouldOverflow,
    .unscale_and_check = UnscaleAndCheck,
    .squared_norm = SquaredNorm,
};

}  // namespace nf::cpu::NF_ISA_NAMESPACE
