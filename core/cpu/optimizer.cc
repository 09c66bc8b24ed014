// Optimizer and mixed-precision kernels on the CPU: AdamW on fp32 master weights, gradient
// unscaling with the non-finite check, and squared norms for clipping.
#include <atomic>
#include <cmath>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/kernel_util.h"

namespace nf::cpu {

absl::Status CpuBackend::AdamWStep(const ops::AdamWArgs& args) {
  float* p = args.params.data<float>();
  const float* g = args.grads.data<float>();
  float* m = args.exp_avg.data<float>();
  float* v = args.exp_avg_sq.data<float>();
  const double t = static_cast<double>(args.step);
  const float bias_correction1 = static_cast<float>(1.0 - std::pow(args.beta1, t));
  const float bias_correction2 = static_cast<float>(1.0 - std::pow(args.beta2, t));
  const float step_size = args.lr / bias_correction1;
  const float inv_sqrt_bc2 = 1.0f / std::sqrt(bias_correction2);
  const float decay = args.lr * args.weight_decay;
  ParallelFor(args.params.numel(), 12, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      m[i] = args.beta1 * m[i] + (1.0f - args.beta1) * g[i];
      v[i] = args.beta2 * v[i] + (1.0f - args.beta2) * g[i] * g[i];
      const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + args.eps;
      p[i] -= decay * p[i] + step_size * m[i] / denom;
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::UnscaleAndCheck(const Tensor& grads, float inv_scale,
                                         const Tensor& found_nonfinite) {
  float* g = grads.data<float>();
  std::atomic<bool> nonfinite{false};
  ParallelFor(grads.numel(), 2, [&](int64_t begin, int64_t end) {
    bool local = false;
    for (int64_t i = begin; i < end; ++i) {
      g[i] *= inv_scale;
      local |= !std::isfinite(g[i]);
    }
    if (local) nonfinite.store(true, std::memory_order_relaxed);
  });
  if (nonfinite.load()) found_nonfinite.data<float>()[0] = 1.0f;
  return absl::OkStatus();
}

absl::Status CpuBackend::SquaredNorm(const Tensor& x, const Tensor& out) {
  const double sum = DispatchFloat(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    return BlockedSum(x.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
      double s = 0.0;
      for (int64_t i = begin; i < end; ++i) {
        const double v = ToFloat(px[i]);
        s += v * v;
      }
      return s;
    });
  });
  out.data<float>()[0] += static_cast<float>(sum);
  return absl::OkStatus();
}

}  // namespace nf::cpu
