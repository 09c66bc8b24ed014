// Vectorised fp32 optimizer kernels of the CPU backend (core/cpu/optimizer.cc calls them): the
// AdamW update, the check that it would stay finite in the model dtype, gradient unscaling with
// the non-finite check, and squared norms. One table per ISA level (core/cpu/isa/isa.h). Every
// kernel works on a range of a flat array, so the thread pool can split the range anywhere
// without changing any element's arithmetic.
//
// The source is compiled without floating-point contraction (no FMA): the AdamW arithmetic is
// then, at every level, exactly the float operations of AdamWUpdateElement in
// core/adamw_update.h (which the CUDA kernel runs with --fmad=false), and the check computes
// bit for bit the values the update writes. Squared norms use the same fixed lanes at every
// level, so they too agree across levels.
#pragma once

#include <cstdint>

#include "core/cpu/isa/isa.h"

namespace nf::cpu {

// AdamW's per-call constants, field for field nf::AdamWConstants (core/adamw_update.h, which
// the variants may not include: it pulls in abseil through core/dtype.h).
struct AdamWKernelConstants {
  float beta1, beta2, eps, step_size, inv_sqrt_bias_correction2, decay;
};

struct OptimizerKernels {
  // One AdamW update of elements [0, n) in place: AdamWUpdateElement(k, p[i], g[i], m[i], v[i]).
  void (*adamw_step)(float* p, const float* g, float* m, float* v, int64_t n,
                     const AdamWKernelConstants& k);
  // Whether adamw_step with the grads multiplied by grad_scale would write a param whose
  // magnitude is not below `threshold` (or is NaN), or a non-finite moment
  // (AdamWElementOverflows). Writes nothing.
  bool (*adamw_would_overflow)(const float* p, const float* g, const float* m, const float* v,
                               int64_t n, const AdamWKernelConstants& k, float grad_scale,
                               float threshold);
  // g[i] *= inv_scale for i in [0, n); whether any result is inf or NaN.
  bool (*unscale_and_check)(float* g, int64_t n, float inv_scale);
  // Sum of x[i]^2 over [0, n), in double, in fixed lanes combined in a fixed order.
  double (*squared_norm)(const float* x, int64_t n);
};

NF_ISA_KERNEL_TABLES(OptimizerKernels, kOptimizerKernels, OptimizerKernelsFor, Optimizer)

}  // namespace nf::cpu
