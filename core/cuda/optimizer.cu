// Optimizer and mixed-precision kernels on the GPU: AdamW on fp32 master weights, gradient
// unscaling with the non-finite check, and squared norms for clipping (a fixed two-pass tree,
// so the norm repeats bit for bit run to run).
#include <cmath>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_util.cuh"

namespace nf::cuda {
namespace {

constexpr int kNormBlocks = 1024;  // partial sums of the first pass (the second sums them)

struct AdamWConstants {
  float beta1, beta2, eps, step_size, inv_sqrt_bias_correction2, decay;
};

__global__ void AdamWKernel(float* p, const float* g, float* m, float* v, int64_t n,
                            AdamWConstants k) {
  NF_GRID_STRIDE_LOOP(i, n) {
    const float grad = g[i];
    const float m_i = k.beta1 * m[i] + (1.0f - k.beta1) * grad;
    const float v_i = k.beta2 * v[i] + (1.0f - k.beta2) * grad * grad;
    m[i] = m_i;
    v[i] = v_i;
    const float denom = sqrtf(v_i) * k.inv_sqrt_bias_correction2 + k.eps;
    p[i] -= k.decay * p[i] + k.step_size * m_i / denom;
  }
}

__global__ void UnscaleAndCheckKernel(float* g, int64_t n, float inv_scale, float* found) {
  bool nonfinite = false;
  NF_GRID_STRIDE_LOOP(i, n) {
    const float value = g[i] * inv_scale;
    g[i] = value;
    nonfinite |= !isfinite(value);
  }
  // Every writer stores the same value, so the race is benign.
  if (__any_sync(0xffffffffu, nonfinite) && (threadIdx.x & 31) == 0) *found = 1.0f;
}

template <typename T>
__global__ void SquaredNormPartials(const T* x, int64_t n, double* partial) {
  __shared__ double scratch[32];
  double sum = 0.0;
  NF_GRID_STRIDE_LOOP(i, n) {
    const double v = ToFloat(x[i]);
    sum += v * v;
  }
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void AddPartials(const double* partial, int count, float* out) {
  __shared__ double scratch[32];
  double sum = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partial[i];
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) out[0] += static_cast<float>(sum);
}

}  // namespace

absl::Status CudaBackend::AdamWStep(const ops::AdamWArgs& args) {
  const int64_t n = args.params.numel();
  if (n == 0) return absl::OkStatus();
  const double t = static_cast<double>(args.step);
  const float bias_correction1 = static_cast<float>(1.0 - std::pow(args.beta1, t));
  const float bias_correction2 = static_cast<float>(1.0 - std::pow(args.beta2, t));
  const AdamWConstants k{args.beta1,
                         args.beta2,
                         args.eps,
                         args.lr / bias_correction1,
                         1.0f / std::sqrt(bias_correction2),
                         args.lr * args.weight_decay};
  AdamWKernel<<<GridFor(n), kThreads, 0, stream()>>>(
      args.params.data<float>(), args.grads.data<float>(), args.exp_avg.data<float>(),
      args.exp_avg_sq.data<float>(), n, k);
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::UnscaleAndCheck(const Tensor& grads, float inv_scale,
                                          const Tensor& found_nonfinite) {
  const int64_t n = grads.numel();
  if (n == 0) return absl::OkStatus();
  UnscaleAndCheckKernel<<<GridFor(n), kThreads, 0, stream()>>>(grads.data<float>(), n, inv_scale,
                                                               found_nonfinite.data<float>());
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::SquaredNorm(const Tensor& x, const Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return absl::OkStatus();
  const int blocks = static_cast<int>(std::min<int64_t>(kNormBlocks, GridFor(n)));
  NF_ASSIGN_OR_RETURN(Tensor partial, Tensor::Empty(DType::kF64, {blocks}, context_.allocator()));
  DispatchFloat(x.dtype(), [&]<typename T>() {
    SquaredNormPartials<<<blocks, kThreads, 0, stream()>>>(DevicePtr<T>(x), n,
                                                           partial.data<double>());
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  AddPartials<<<1, kThreads, 0, stream()>>>(partial.data<double>(), blocks, out.data<float>());
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace nf::cuda
