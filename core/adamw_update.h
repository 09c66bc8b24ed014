// The arithmetic of one AdamW element update, shared by the CPU and CUDA kernels of
// ops::AdamWStep and of the check that runs before it (ops::AdamWWouldOverflow), so the check
// sees exactly the values the update would write (the same float operations in the same order;
// neither backend is built with fast-math or contracts them into FMAs), and judges them by the
// model dtype's overflow threshold, which is exactly where its rounding cast gives inf. The CUDA
// kernels call these functions; the CPU's vectorised kernels (core/cpu/isa/optimizer_kernels.cc,
// compiled once per ISA level, may not include this header) spell out the same operations, and
// tests/core/optimizer_kernels_test.cc holds every level to these functions' bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtype.h"
#include "core/host_device.h"

namespace nf {

// Per-call constants of AdamW step `step` (counting from 1), computed on the host.
struct AdamWConstants {
  float beta1, beta2, eps, step_size, inv_sqrt_bias_correction2, decay;
};

inline AdamWConstants MakeAdamWConstants(float lr, float beta1, float beta2, float eps,
                                         float weight_decay, int64_t step) {
  const double t = static_cast<double>(step);
  const float bias_correction1 = static_cast<float>(1.0 - std::pow(beta1, t));
  const float bias_correction2 = static_cast<float>(1.0 - std::pow(beta2, t));
  return {.beta1 = beta1,
          .beta2 = beta2,
          .eps = eps,
          .step_size = lr / bias_correction1,
          .inv_sqrt_bias_correction2 = 1.0f / std::sqrt(bias_correction2),
          .decay = lr * weight_decay};
}

// The new (param, exp_avg, exp_avg_sq) of one element:
//   m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= decay p + step_size m / (sqrt(v)/sqrt(bc2) +
//   eps)
struct AdamWElement {
  float param, exp_avg, exp_avg_sq;
};

NF_HOST_DEVICE inline AdamWElement AdamWUpdateElement(const AdamWConstants& k, float p, float g,
                                                      float m, float v) {
  const float m_new = k.beta1 * m + (1.0f - k.beta1) * g;
  const float v_new = k.beta2 * v + (1.0f - k.beta2) * g * g;
  const float denom = sqrtf(v_new) * k.inv_sqrt_bias_correction2 + k.eps;
  return {p - (k.decay * p + k.step_size * m_new / denom), m_new, v_new};
}

// The smallest fp32 magnitude that the round-to-nearest-even cast to `dtype` (ops::Cast, on
// either backend) turns into inf: fp16 65520, halfway from its largest finite 65504 to 2^16
// (the tie goes to the even 2^16, inf); bf16 0x7F7F8000, halfway from its largest finite
// 0x7F7F0000 to 2^128 (likewise); f32 inf. A cast is inf or NaN exactly when
// !(|x| < threshold), NaN included.
inline float AdamWOverflowThreshold(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return 65520.0f;
    case DType::kBF16:
      return 0x1.FFp127f;  // 0x7F7F8000
    default:
      return std::numeric_limits<float>::infinity();
  }
}

// Whether an updated element leaves the model dtype's range (param past `threshold`, see
// AdamWOverflowThreshold) or has a non-finite moment. Branch-free.
NF_HOST_DEVICE inline bool AdamWElementOverflows(const AdamWElement& e, float threshold) {
  constexpr float kFloatMax = 0x1.fffffep127f;
  return !(fabsf(e.param) < threshold) | !(fabsf(e.exp_avg) <= kFloatMax) |
         !(fabsf(e.exp_avg_sq) <= kFloatMax);
}

}  // namespace nf
