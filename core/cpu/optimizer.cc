// Optimizer and mixed-precision kernels on the CPU: AdamW on fp32 master weights and the check
// that its update would stay finite in the model dtype, gradient unscaling with the non-finite
// check, and squared norms for clipping. The fp32 loops are the vectorised kernels of
// core/cpu/isa/optimizer_kernels.h (AdamW's arithmetic there is core/adamw_update.h's, bit for
// bit); the thread pool splits their ranges.
#include <atomic>

#include "core/adamw_update.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/isa/optimizer_kernels.h"
#include "core/cpu/kernel_util.h"

namespace nf::cpu {
namespace {

AdamWKernelConstants KernelConstantsOf(const ops::AdamWArgs& args) {
  const AdamWConstants k =
      MakeAdamWConstants(args.lr, args.beta1, args.beta2, args.eps, args.weight_decay, args.step);
  return {.beta1 = k.beta1,
          .beta2 = k.beta2,
          .eps = k.eps,
          .step_size = k.step_size,
          .inv_sqrt_bias_correction2 = k.inv_sqrt_bias_correction2,
          .decay = k.decay};
}

// Whether check(begin, end) is true for any piece of [0, n) the thread pool hands out.
template <typename Check>
bool AnyInParallel(int64_t n, int64_t work_per_index, Check check) {
  std::atomic<bool> any{false};
  ParallelFor(n, work_per_index, [&](int64_t begin, int64_t end) {
    if (check(begin, end)) any.store(true, std::memory_order_relaxed);
  });
  return any.load();
}

}  // namespace

absl::Status CpuBackend::AdamWStep(const ops::AdamWArgs& args) {
  float* p = args.params.data<float>();
  const float* g = args.grads.data<float>();
  float* m = args.exp_avg.data<float>();
  float* v = args.exp_avg_sq.data<float>();
  const AdamWKernelConstants k = KernelConstantsOf(args);
  const auto step = Optimizer().adamw_step;
  ParallelFor(args.params.numel(), 12, [&](int64_t begin, int64_t end) {
    step(p + begin, g + begin, m + begin, v + begin, end - begin, k);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::AdamWWouldOverflow(const ops::AdamWArgs& args, float grad_scale,
                                            DType model_dtype, const Tensor& found) {
  const float* p = args.params.data<float>();
  const float* g = args.grads.data<float>();
  const float* m = args.exp_avg.data<float>();
  const float* v = args.exp_avg_sq.data<float>();
  const AdamWKernelConstants k = KernelConstantsOf(args);
  const float threshold = AdamWOverflowThreshold(model_dtype);
  const auto would_overflow = Optimizer().adamw_would_overflow;
  if (AnyInParallel(args.params.numel(), 14, [&](int64_t begin, int64_t end) {
        return would_overflow(p + begin, g + begin, m + begin, v + begin, end - begin, k,
                              grad_scale, threshold);
      })) {
    found.data<float>()[0] = 1.0f;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::UnscaleAndCheck(const Tensor& grads, float inv_scale,
                                         const Tensor& found_nonfinite) {
  float* g = grads.data<float>();
  const auto unscale_and_check = Optimizer().unscale_and_check;
  if (AnyInParallel(grads.numel(), 2, [&](int64_t begin, int64_t end) {
        return unscale_and_check(g + begin, end - begin, inv_scale);
      })) {
    found_nonfinite.data<float>()[0] = 1.0f;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::SquaredNorm(const Tensor& x, const Tensor& out) {
  // Fixed blocks: the sum does not depend on the thread count.
  constexpr int64_t kBlock = 1 << 14;
  const double sum = DispatchFloat(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    return BlockedSum(x.numel(), kBlock, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<T, float>) {
        return Optimizer().squared_norm(px + begin, end - begin);
      } else {
        double s = 0.0;
        for (int64_t i = begin; i < end; ++i) {
          const double v = ToFloat(px[i]);
          s += v * v;
        }
        return s;
      }
    });
  });
  out.data<float>()[0] += static_cast<float>(sum);
  return absl::OkStatus();
}

}  // namespace nf::cpu
