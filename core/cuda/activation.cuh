// The activations and their derivatives on the GPU (nvcc only), in fp32: the elementwise
// activation kernels and the fused FFN middle (activation_norm.cu) share them, so both compute
// the same values bit for bit.
#pragma once

#include "core/ops/ops.h"

namespace nf::cuda {

inline constexpr float kSqrtHalf = 0.70710678118654752f;     // 1 / sqrt(2)
inline constexpr float kInvSqrt2Pi = 0.39894228040143268f;   // 1 / sqrt(2 pi)
inline constexpr float kSqrt2OverPi = 0.79788456080286536f;  // sqrt(2 / pi)
inline constexpr float kGeluTanhCubic = 0.044715f;

__device__ inline float Activate(ops::Activation act, float x) {
  switch (act) {
    case ops::Activation::kGelu:
      return 0.5f * x * (1.0f + erff(x * kSqrtHalf));
    case ops::Activation::kGeluTanh:
      return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x)));
    case ops::Activation::kReluSquared:
      return x > 0.0f ? x * x : 0.0f;
  }
  return 0.0f;
}

__device__ inline float ActivationDerivative(ops::Activation act, float x) {
  switch (act) {
    case ops::Activation::kGelu: {
      const float cdf = 0.5f * (1.0f + erff(x * kSqrtHalf));
      const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
      return cdf + x * pdf;
    }
    case ops::Activation::kGeluTanh: {
      const float inner = kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x);
      const float t = tanhf(inner);
      const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCubic * x * x);
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
    }
    case ops::Activation::kReluSquared:
      return x > 0.0f ? 2.0f * x : 0.0f;
  }
  return 0.0f;
}

}  // namespace nf::cuda
