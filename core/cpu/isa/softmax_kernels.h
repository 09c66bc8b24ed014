// Vectorised fp32 softmax-family kernels of the CPU backend: the row softmax of attention
// (core/cpu/attention.cc, forward, backward and KV-cache decoding) and of SoftmaxForward /
// SoftmaxBackward, and cross-entropy's exp sums and gradients (core/cpu/embedding_loss.cc).
// One table per ISA level (core/cpu/isa/isa.h); fp16 / bf16 tensors keep the scalar loops.
//
// Every exp here is the family's own fp32 exp (softmax_kernels.cc): within kExpMaxUlps ulp of
// the exact value for results of at least 2^-126, 0 below that, inf above FLT_MAX, NaN for NaN.
// Sums run in double over fixed lanes (core/cpu/isa/lanes.h): the same for any thread count.
#pragma once

#include <cstdint>

#include "core/cpu/isa/isa.h"

namespace nf::cpu {

// The bound on the family's exp error for fp32 inputs with a normal result, in ulps of the
// result. Measured over every such input against double exp: 1.22 ulp at the baseline (no FMA),
// 0.94 ulp with FMA (AVX2, AVX-512); tests/core/softmax_kernels_test.cc checks a sample at every
// level this CPU runs.
inline constexpr double kExpMaxUlps = 1.5;

struct SoftmaxKernels {
  // out[i] = exp(x[i] - shift) for i in [0, n), the difference taken in fp32.
  void (*exp_shifted)(const float* x, int64_t n, float shift, float* out);
  // max of x[0, n) (NaN entries are skipped); -inf when n = 0.
  float (*max)(const float* x, int64_t n);
  // sum of exp(x[i] - shift) over [0, n), in double.
  double (*sum_exp_shifted)(const float* x, int64_t n, float shift);
  // y = softmax(x) over [0, n) (y may be x): exp(x - max) scaled by 1 / their double sum.
  // Returns the log-sum-exp max + log(sum). A row whose max is -inf (fully masked, or empty)
  // gets zeros and returns -inf.
  float (*softmax)(const float* x, int64_t n, float* y);
  // out[i] = scale * exp(x[i] - shift) (out may be x).
  void (*scaled_exp_shifted)(const float* x, int64_t n, float shift, float scale, float* out);
  // sum of a[i] * b[i] over [0, n), in double.
  double (*dot)(const float* a, const float* b, int64_t n);
  // out[i] = p[i] * (g[i] - row_dot) (out may be g): the softmax backward, with row_dot the
  // row's sum of p * g.
  void (*softmax_grad)(const float* p, const float* g, int64_t n, float row_dot, float* out);
};

NF_ISA_KERNEL_TABLES(SoftmaxKernels, kSoftmaxKernels, SoftmaxKernelsFor, Softmax)

}  // namespace nf::cpu
