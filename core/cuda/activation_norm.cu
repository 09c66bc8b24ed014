// NormFormer's FFN middle on the GPU (ops.h ActivationNormForward/Backward): fc1's output x to
// y = LayerNorm(dropout(act(x))), one thread block per row, one kernel where the composition
// runs three (activation, dropout, LayerNorm) forward and five backward. The row steps are the
// LayerNorm kernels' (layer_norm_rows.cuh), the dropout's (dropout_rows.cuh) and the activation
// kernels' (activation.cuh), each result rounded to the storage type where the composition stores
// it, so the results are the composition's bit for bit (tests/gpu/fused_kernels_test.cc).
//
// The activation's output a still goes through `scratch` (the dropout's groups span threads and
// the LayerNorm's backward needs a for its parameter gradients), but a row is read back by the
// block that just wrote it, from L2.
#include "core/cuda/activation.cuh"
#include "core/cuda/column_sums.cuh"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/dropout_rows.cuh"
#include "core/cuda/kernel_util.cuh"
#include "core/cuda/layer_norm_rows.cuh"
#include "core/ops/checks.h"

namespace nf::cuda {
namespace {

// a = dropout(act(x)) of row r into a_row (T-rounded, as the composition's scratch), for every
// thread of the block to read afterwards.
template <typename T>
__device__ void ActivatedRow(ops::Activation act, const DropoutMask& mask, const T* x_row, T* a_row,
                             int64_t r, int64_t cols) {
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    a_row[c] = FromFloat<T>(Activate(act, ToFloat(x_row[c])));
  }
  if (mask.active()) {
    __syncthreads();  // the dropout's groups span other threads' columns
    DropoutRowInBlock(mask, a_row, a_row, r, cols);
  }
  __syncthreads();
}

template <typename T, typename W>
struct ForwardPointers {
  const T* x;
  const W* weight;
  const W* bias;
  T* y;
  float* mean;
  float* rstd;
  T* scratch;
};

template <typename T, typename W>
__global__ void ActivationNormForwardKernel(ForwardPointers<T, W> p, ops::Activation act,
                                            DropoutMask mask, int64_t cols, float eps) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, at = r * cols;
  T* a = p.scratch + at;
  ActivatedRow(act, mask, p.x + at, a, r, cols);
  const RowStatistics stats = RowStatisticsOf(a, cols, eps, scratch);
  if (threadIdx.x == 0) {
    p.mean[r] = stats.mean;
    p.rstd[r] = stats.rstd;
  }
  NormalizeRow(a, p.weight, p.bias, p.y + at, cols, stats.mean, stats.rstd);
}

template <typename T, typename W>
struct BackwardPointers {
  const T* dy;
  const T* x;
  const W* weight;
  const float* mean;
  const float* rstd;
  T* dx;
  T* scratch;
};

// Row r: a again from x, the LayerNorm's input gradient, through the dropout's mask, times
// act'(x).
template <typename T, typename W>
__global__ void ActivationNormBackwardKernel(BackwardPointers<T, W> p, ops::Activation act,
                                             DropoutMask mask, int64_t cols) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, at = r * cols;
  const T* a = p.scratch + at;
  ActivatedRow(act, mask, p.x + at, p.scratch + at, r, cols);
  const T* dy = p.dy + at;
  const float mean = p.mean[r], rstd = p.rstd[r];
  const RowSums sums = BackwardRowSums(a, dy, p.weight, cols, mean, rstd, scratch);
  T* dx = p.dx + at;
  InputGradRow(a, dy, p.weight, dx, cols, mean, rstd, sums.g / cols, sums.g_xhat / cols);
  if (mask.active()) {
    __syncthreads();
    DropoutRowInBlock(mask, dx, dx, r, cols);
    __syncthreads();
  }
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    dx[c] = FromFloat<T>(ToFloat(dx[c]) * ActivationDerivative(act, ToFloat(p.x[at + c])));
  }
}

}  // namespace

absl::Status CudaBackend::ActivationNormForward(const ops::ActivationNormArgs& args) {
  const int64_t rows = ops::Rows(args.x), cols = ops::Cols(args.x);
  if (rows == 0) return absl::OkStatus();
  DispatchFloat(args.x.dtype(), [&]<typename T>() {
    DispatchFloat(args.weight.dtype(), [&]<typename W>() {
      const ForwardPointers<T, W> p{DevicePtr<T>(args.x),      DevicePtr<W>(args.weight),
                                    DevicePtr<W>(args.bias),   DevicePtr<T>(args.y),
                                    args.mean.data<float>(),   args.rstd.data<float>(),
                                    DevicePtr<T>(args.scratch)};
      Launch<ActivationNormForwardKernel<T, W>>(
          {static_cast<unsigned int>(rows), RowThreads(cols), 0, stream()}, p, args.act,
          DropoutMask::Of(args.dropout), cols, args.eps);
    });
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::ActivationNormBackward(const ops::ActivationNormBackwardArgs& args) {
  const int64_t rows = ops::Rows(args.x), cols = ops::Cols(args.x);
  if (rows == 0) return absl::OkStatus();
  return DispatchFloat(args.x.dtype(), [&]<typename T>() -> absl::Status {
    return DispatchFloat(args.weight.dtype(), [&]<typename W>() -> absl::Status {
      const BackwardPointers<T, W> p{DevicePtr<T>(args.dy),     DevicePtr<T>(args.x),
                                     DevicePtr<W>(args.weight), args.mean.data<float>(),
                                     args.rstd.data<float>(),   DevicePtr<T>(args.dx),
                                     DevicePtr<T>(args.scratch)};
      Launch<ActivationNormBackwardKernel<T, W>>(
          {static_cast<unsigned int>(rows), RowThreads(cols), 0, stream()}, p, args.act,
          DropoutMask::Of(args.dropout), cols);
      NF_CUDA_RETURN_IF_LAUNCH_FAILED();
      // The parameter gradients from dy (untouched) and a (in scratch), after the rows.
      return AddColumnSums<2>(context_, rows, cols,
                              LayerNormParamGradValues<T>{p.scratch, p.dy, p.mean, p.rstd, cols},
                              Outputs<2>{{args.dweight.data<float>(), args.dbias.data<float>()}});
    });
  });
}

}  // namespace nf::cuda
