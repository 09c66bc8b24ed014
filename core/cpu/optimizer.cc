// Optimizer and mixed-precision kernels on the CPU: AdamW on fp32 master weights and the check
// that its update would stay finite in the model dtype (one element function for both,
// core/adamw_update.h), gradient unscaling with the non-finite check, and squared norms for
// clipping.
#include <atomic>
#include <cmath>

#include "core/adamw_update.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/kernel_util.h"

namespace nf::cpu {

absl::Status CpuBackend::AdamWStep(const ops::AdamWArgs& args) {
  float* p = args.params.data<float>();
  const float* g = args.grads.data<float>();
  float* m = args.exp_avg.data<float>();
  float* v = args.exp_avg_sq.data<float>();
  const AdamWConstants k =
      MakeAdamWConstants(args.lr, args.beta1, args.beta2, args.eps, args.weight_decay, args.step);
  ParallelFor(args.params.numel(), 12, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const AdamWElement e = AdamWUpdateElement(k, p[i], g[i], m[i], v[i]);
      p[i] = e.param;
      m[i] = e.exp_avg;
      v[i] = e.exp_avg_sq;
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::AdamWWouldOverflow(const ops::AdamWArgs& args, float grad_scale,
                                            DType model_dtype, const Tensor& found) {
  const float* p = args.params.data<float>();
  const float* g = args.grads.data<float>();
  const float* m = args.exp_avg.data<float>();
  const float* v = args.exp_avg_sq.data<float>();
  const AdamWConstants k =
      MakeAdamWConstants(args.lr, args.beta1, args.beta2, args.eps, args.weight_decay, args.step);
  const float threshold = AdamWOverflowThreshold(model_dtype);
  std::atomic<bool> overflow{false};
  ParallelFor(args.params.numel(), 14, [&](int64_t begin, int64_t end) {
    bool local = false;
    for (int64_t i = begin; i < end; ++i) {
      // grad_scale * g is what ops::Scale leaves in the grads before AdamWStep reads them.
      local |= AdamWElementOverflows(AdamWUpdateElement(k, p[i], grad_scale * g[i], m[i], v[i]),
                                     threshold);
    }
    if (local) overflow.store(true, std::memory_order_relaxed);
  });
  if (overflow.load()) found.data<float>()[0] = 1.0f;
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
