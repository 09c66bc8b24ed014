// Elementwise and per-column CUDA kernels: bias, activations, dropout, casts, fills, BLAS-1.
// Grid-stride loops, one element per thread per iteration, fp32 arithmetic.
#include "core/cuda/activation.cuh"
#include "core/cuda/column_sums.cuh"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/dropout_rows.cuh"
#include "core/cuda/kernel_util.cuh"
#include "core/ops/checks.h"

namespace nf::cuda {
namespace {

template <typename T, typename B>
__global__ void AddBiasKernel(T* x, const B* bias, int64_t n, int64_t cols) {
  NF_GRID_STRIDE_LOOP(i, n) { x[i] = FromFloat<T>(ToFloat(x[i]) + ToFloat(bias[i % cols])); }
}

template <typename T>
struct GradValue {
  const T* dy;
  int64_t cols;
  __device__ Values<1> operator()(int64_t r, int64_t c) const {
    return {{ToFloat(dy[r * cols + c])}};
  }
};

template <typename T>
__global__ void ActivationForwardKernel(ops::Activation act, const T* x, T* y, int64_t n) {
  NF_GRID_STRIDE_LOOP(i, n) { y[i] = FromFloat<T>(Activate(act, ToFloat(x[i]))); }
}

template <typename T>
__global__ void ActivationBackwardKernel(ops::Activation act, const T* x, const T* dy, T* dx,
                                         int64_t n) {
  NF_GRID_STRIDE_LOOP(i, n) {
    dx[i] = FromFloat<T>(ToFloat(dy[i]) * ActivationDerivative(act, ToFloat(x[i])));
  }
}

// One thread per group of 4 columns (one Philox call).
template <typename T>
__global__ void DropoutKernel(const T* x, T* y, int64_t rows, int64_t cols, DropoutMask mask) {
  const int64_t groups_per_row = mask.groups(cols);
  NF_GRID_STRIDE_LOOP(g, rows * groups_per_row) {
    const int64_t r = g / groups_per_row;
    DropoutGroup(mask, x + r * cols, y + r * cols, r, cols,
                 mask.first_group() + g % groups_per_row);
  }
}

template <typename S, typename D>
__global__ void CastKernel(const S* src, D* dst, int64_t n) {
  NF_GRID_STRIDE_LOOP(i, n) { dst[i] = FromFloat<D>(ToFloat(src[i])); }
}

template <typename T>
__global__ void FillKernel(T* x, T value, int64_t n) {
  NF_GRID_STRIDE_LOOP(i, n) { x[i] = value; }
}

template <typename T>
__global__ void ScaleKernel(T* x, float alpha, int64_t n) {
  NF_GRID_STRIDE_LOOP(i, n) { x[i] = FromFloat<T>(alpha * ToFloat(x[i])); }
}

template <typename X, typename Y>
__global__ void AxpyKernel(float alpha, const X* x, Y* y, int64_t n) {
  NF_GRID_STRIDE_LOOP(i, n) { y[i] = FromFloat<Y>(ToFloat(y[i]) + alpha * ToFloat(x[i])); }
}

}  // namespace

absl::Status CudaBackend::AddBias(const Tensor& x, const Tensor& bias) {
  const int64_t n = x.numel();
  if (n == 0) return absl::OkStatus();
  DispatchFloat(x.dtype(), [&]<typename T>() {
    DispatchFloat(bias.dtype(), [&]<typename B>() {
      Launch<AddBiasKernel<T, B>>({GridFor(n), kThreads, 0, stream()}, DevicePtr<T>(x),
                                  DevicePtr<B>(bias), n, ops::Cols(x));
    });
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::BiasBackward(const Tensor& dy, const Tensor& dbias) {
  return DispatchFloat(dy.dtype(), [&]<typename T>() {
    return AddColumnSums<1>(context_, ops::Rows(dy), ops::Cols(dy),
                            GradValue<T>{DevicePtr<T>(dy), ops::Cols(dy)},
                            Outputs<1>{{dbias.data<float>()}});
  });
}

absl::Status CudaBackend::ActivationForward(ops::Activation act, const Tensor& x, const Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return absl::OkStatus();
  DispatchFloat(x.dtype(), [&]<typename T>() {
    Launch<ActivationForwardKernel<T>>({GridFor(n), kThreads, 0, stream()}, act, DevicePtr<T>(x),
                                       DevicePtr<T>(y), n);
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::ActivationBackward(ops::Activation act, const Tensor& x, const Tensor& dy,
                                             const Tensor& dx) {
  const int64_t n = x.numel();
  if (n == 0) return absl::OkStatus();
  DispatchFloat(x.dtype(), [&]<typename T>() {
    Launch<ActivationBackwardKernel<T>>({GridFor(n), kThreads, 0, stream()}, act, DevicePtr<T>(x),
                                        DevicePtr<T>(dy), DevicePtr<T>(dx), n);
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::Dropout(const Tensor& x, const Tensor& y, const ops::DropoutSpec& spec) {
  if (spec.p == 0.0f) return Cast(x, y);
  const int64_t rows = ops::Rows(x), cols = ops::Cols(x);
  if (rows == 0 || cols == 0) return absl::OkStatus();
  const DropoutMask mask = DropoutMask::Of(spec);
  const int64_t groups = rows * mask.groups(cols);
  DispatchFloat(x.dtype(), [&]<typename T>() {
    Launch<DropoutKernel<T>>({GridFor(groups), kThreads, 0, stream()}, DevicePtr<T>(x),
                             DevicePtr<T>(y), rows, cols, mask);
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::Cast(const Tensor& src, const Tensor& dst) {
  const int64_t n = src.numel();
  if (n == 0) return absl::OkStatus();
  if (src.dtype() == dst.dtype()) {
    if (src.raw_data() == dst.raw_data()) return absl::OkStatus();
    NF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(),
                                            cudaMemcpyDeviceToDevice, stream()));
    return absl::OkStatus();
  }
  DispatchFloat(src.dtype(), [&]<typename S>() {
    DispatchFloat(dst.dtype(), [&]<typename D>() {
      Launch<CastKernel<S, D>>({GridFor(n), kThreads, 0, stream()}, DevicePtr<S>(src),
                               DevicePtr<D>(dst), n);
    });
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::Fill(const Tensor& x, float value) {
  const int64_t n = x.numel();
  if (n == 0) return absl::OkStatus();
  auto fill = [&]<typename T>(T v) {
    Launch<FillKernel<T>>({GridFor(n), kThreads, 0, stream()}, static_cast<T*>(x.raw_data()), v, n);
  };
  switch (x.dtype()) {
    case DType::kF32:
      fill(value);
      break;
    case DType::kF16:
      fill(__float2half_rn(value));
      break;
    case DType::kBF16:
      fill(__float2bfloat16_rn(value));
      break;
    case DType::kI32:
      fill(static_cast<int32_t>(value));
      break;
    case DType::kI64:
      fill(static_cast<int64_t>(value));
      break;
    case DType::kU16:
      fill(static_cast<uint16_t>(value));
      break;
    case DType::kU8:
      fill(static_cast<uint8_t>(value));
      break;
    case DType::kF64:
      fill(static_cast<double>(value));
      break;
  }
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::Scale(const Tensor& x, float alpha) {
  const int64_t n = x.numel();
  if (n == 0) return absl::OkStatus();
  DispatchFloat(x.dtype(), [&]<typename T>() {
    Launch<ScaleKernel<T>>({GridFor(n), kThreads, 0, stream()}, DevicePtr<T>(x), alpha, n);
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::Axpy(float alpha, const Tensor& x, const Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return absl::OkStatus();
  DispatchFloat(x.dtype(), [&]<typename X>() {
    DispatchFloat(y.dtype(), [&]<typename Y>() {
      Launch<AxpyKernel<X, Y>>({GridFor(n), kThreads, 0, stream()}, alpha, DevicePtr<X>(x),
                               DevicePtr<Y>(y), n);
    });
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace nf::cuda
