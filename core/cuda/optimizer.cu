// Optimizer and mixed-precision kernels on the GPU: AdamW on fp32 master weights and the check
// that its update would stay finite in the model dtype (one element function for both, shared
// with the CPU backend: core/adamw_update.h), gradient unscaling with the non-finite check, and
// squared norms for clipping (a fixed two-pass tree, so the norm repeats bit for bit run to
// run).
#include <cmath>

#include "core/adamw_update.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_util.cuh"

namespace nf::cuda {
namespace {

constexpr int kNormBlocks = 1024;  // partial sums of the first pass (the second sums them)

__global__ void AdamWKernel(float* p, const float* g, float* m, float* v, int64_t n,
                            AdamWConstants k) {
  NF_GRID_STRIDE_LOOP(i, n) {
    const AdamWElement e = AdamWUpdateElement(k, p[i], g[i], m[i], v[i]);
    p[i] = e.param;
    m[i] = e.exp_avg;
    v[i] = e.exp_avg_sq;
  }
}

__global__ void AdamWWouldOverflowKernel(const float* p, const float* g, const float* m,
                                         const float* v, int64_t n, AdamWConstants k,
                                         float grad_scale, float threshold, float* found) {
  bool overflow = false;
  NF_GRID_STRIDE_LOOP(i, n) {
    // grad_scale * g is what ScaleKernel leaves in the grads before AdamWKernel reads them.
    overflow |= AdamWElementOverflows(AdamWUpdateElement(k, p[i], grad_scale * g[i], m[i], v[i]),
                                      threshold);
  }
  // Every writer stores the same value, so the race is benign.
  if (__any_sync(0xffffffffu, overflow) && (threadIdx.x & 31) == 0) *found = 1.0f;
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
  const AdamWConstants k =
      MakeAdamWConstants(args.lr, args.beta1, args.beta2, args.eps, args.weight_decay, args.step);
  Launch<AdamWKernel>({GridFor(n), kThreads, 0, stream()}, args.params.data<float>(),
                      args.grads.data<float>(), args.exp_avg.data<float>(),
                      args.exp_avg_sq.data<float>(), n, k);
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::AdamWWouldOverflow(const ops::AdamWArgs& args, float grad_scale,
                                             DType model_dtype, const Tensor& found) {
  const int64_t n = args.params.numel();
  if (n == 0) return absl::OkStatus();
  const AdamWConstants k =
      MakeAdamWConstants(args.lr, args.beta1, args.beta2, args.eps, args.weight_decay, args.step);
  Launch<AdamWWouldOverflowKernel>({GridFor(n), kThreads, 0, stream()}, args.params.data<float>(),
                                   args.grads.data<float>(), args.exp_avg.data<float>(),
                                   args.exp_avg_sq.data<float>(), n, k, grad_scale,
                                   AdamWOverflowThreshold(model_dtype), found.data<float>());
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::UnscaleAndCheck(const Tensor& grads, float inv_scale,
                                          const Tensor& found_nonfinite) {
  const int64_t n = grads.numel();
  if (n == 0) return absl::OkStatus();
  Launch<UnscaleAndCheckKernel>({GridFor(n), kThreads, 0, stream()}, grads.data<float>(), n,
                                inv_scale, found_nonfinite.data<float>());
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::SquaredNorm(const Tensor& x, const Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return absl::OkStatus();
  const int blocks = static_cast<int>(std::min<int64_t>(kNormBlocks, GridFor(n)));
  NF_ASSIGN_OR_RETURN(Tensor partial, Tensor::Empty(DType::kF64, {blocks}, context_.allocator()));
  DispatchFloat(x.dtype(), [&]<typename T>() {
    Launch<SquaredNormPartials<T>>({static_cast<unsigned int>(blocks), kThreads, 0, stream()},
                                   DevicePtr<T>(x), n, partial.data<double>());
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  Launch<AddPartials>({1, kThreads, 0, stream()}, partial.data<double>(), blocks,
                      out.data<float>());
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace nf::cuda
