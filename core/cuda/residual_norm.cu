// The residual add fused with the LayerNorms on either side of it, on the GPU (ops.h
// ResidualNormForward/Backward): one thread block per row does what the composition does in
// five kernels forward (branch LayerNorm, dropout, cast, axpy, LayerNorm) and three backward
// (LayerNorm backward, axpy, dropout; the branch LayerNorm's backward is the fourth). The row
// steps are the LayerNorm kernels' own (layer_norm_rows.cuh) and the dropout's
// (dropout_rows.cuh), and each intermediate is rounded to the storage type where the composition
// stores it, so the results are the composition's bit for bit (CudaOpsTest.ResidualNorm*).
//
// Intermediates still go through `scratch` (the row's z or dz), but a row is read and written by
// one block right after it was written, so they are served from L2; the parameter gradients of
// both LayerNorms are one column-sum pass.
#include "core/cuda/column_sums.cuh"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/dropout_rows.cuh"
#include "core/cuda/kernel_util.cuh"
#include "core/cuda/layer_norm_rows.cuh"
#include "core/ops/checks.h"
#include "core/ops/composed_ops.h"

namespace nf::cuda {
namespace {

// The device arrays of one LayerNorm: its parameters and per-row statistics ([cols], [rows]).
template <typename W>
struct NormArrays {
  const W* weight = nullptr;  // null: no such LayerNorm
  const W* bias = nullptr;
  float* mean = nullptr;
  float* rstd = nullptr;
};

template <typename T, typename X, typename W>
struct ForwardPointers {
  const X* x;
  const T* branch;
  T* residual;
  T* y;
  T* scratch;
  NormArrays<W> norm, branch_norm;
};

// Row r: z = dropout(LayerNorm_branch(branch)) (or dropout(branch)) into scratch,
// residual = T(x) + z, y = LayerNorm(residual).
template <typename T, typename X, typename W>
__global__ void ResidualNormForwardKernel(ForwardPointers<T, X, W> p, DropoutMask mask,
                                          int64_t cols, float eps) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, at = r * cols;
  const T* added = p.branch + at;
  T* z = p.scratch + at;
  if (p.branch_norm.weight != nullptr) {
    const RowStatistics stats = RowStatisticsOf(added, cols, eps, scratch);
    if (threadIdx.x == 0) {
      p.branch_norm.mean[r] = stats.mean;
      p.branch_norm.rstd[r] = stats.rstd;
    }
    NormalizeRow(added, p.branch_norm.weight, p.branch_norm.bias, z, cols, stats.mean, stats.rstd);
    __syncthreads();  // the dropout's groups span other threads' columns
    if (mask.active()) DropoutRowInBlock(mask, z, z, r, cols);
    added = z;
  } else if (mask.active()) {
    DropoutRowInBlock(mask, added, z, r, cols);
    added = z;
  }
  __syncthreads();
  T* residual = p.residual + at;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T x = FromFloat<T>(ToFloat(p.x[at + c]));  // the composition's Cast
    residual[c] = FromFloat<T>(ToFloat(x) + ToFloat(added[c]));
  }
  // Each thread reads back only the columns it wrote: no barrier needed before the statistics.
  const RowStatistics stats = RowStatisticsOf(residual, cols, eps, scratch);
  if (threadIdx.x == 0) {
    p.norm.mean[r] = stats.mean;
    p.norm.rstd[r] = stats.rstd;
  }
  NormalizeRow(residual, p.norm.weight, p.norm.bias, p.y + at, cols, stats.mean, stats.rstd);
}

template <typename T, typename W>
struct BackwardPointers {
  const T* dy;
  const T* residual;
  const T* branch;
  T* d_residual;
  T* d_branch;
  T* scratch;
  NormArrays<W> norm, branch_norm;  // mean and rstd are read only
};

// Row r: d_residual += LayerNorm's input gradient; dz = dropout(d_residual), into d_branch or,
// with the branch LayerNorm, into scratch and through that LayerNorm's backward into d_branch.
template <typename T, typename W>
__global__ void ResidualNormBackwardKernel(BackwardPointers<T, W> p, DropoutMask mask,
                                           int64_t cols) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, at = r * cols;
  {
    const T* x = p.residual + at;
    const T* dy = p.dy + at;
    const float mean = p.norm.mean[r], rstd = p.norm.rstd[r];
    const RowSums sums = BackwardRowSums(x, dy, p.norm.weight, cols, mean, rstd, scratch);
    T* d_residual = p.d_residual + at;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const T dx = FromFloat<T>(
          InputGradValue(x, dy, p.norm.weight, c, mean, rstd, sums.g / cols, sums.g_xhat / cols));
      d_residual[c] = FromFloat<T>(ToFloat(d_residual[c]) + ToFloat(dx));
    }
  }
  __syncthreads();  // the dropout's groups span other threads' columns
  if (p.branch_norm.weight == nullptr) {
    DropoutRowInBlock(mask, p.d_residual + at, p.d_branch + at, r, cols);
    return;
  }
  const T* dz = p.scratch + at;
  DropoutRowInBlock(mask, p.d_residual + at, p.scratch + at, r, cols);
  __syncthreads();
  const T* x = p.branch + at;
  const float mean = p.branch_norm.mean[r], rstd = p.branch_norm.rstd[r];
  const RowSums sums = BackwardRowSums(x, dz, p.branch_norm.weight, cols, mean, rstd, scratch);
  InputGradRow(x, dz, p.branch_norm.weight, p.d_branch + at, cols, mean, rstd, sums.g / cols,
               sums.g_xhat / cols);
}

// Both LayerNorms' (dy * xhat, dy) at once, for one column-sum pass: the residual's from dy,
// the branch's from dz (scratch).
template <typename T>
struct BothParamGradValues {
  LayerNormParamGradValues<T> norm, branch_norm;
  __device__ Values<4> operator()(int64_t r, int64_t c) const {
    const Values<2> a = norm(r, c), b = branch_norm(r, c);
    return {{a.v[0], a.v[1], b.v[0], b.v[1]}};
  }
};

template <typename W>
NormArrays<W> ArraysOf(const Tensor& weight, const Tensor& bias, const Tensor& mean,
                       const Tensor& rstd) {
  if (!weight.defined()) return {};
  return {DevicePtr<W>(weight), bias.defined() ? DevicePtr<W>(bias) : nullptr, mean.data<float>(),
          rstd.data<float>()};
}

// The fused kernels take one parameter dtype for both LayerNorms; a run that mixes them (none
// does today) takes the composition.
template <typename Args>
bool ParameterDTypesAgree(const Args& args) {
  return !args.norms_branch() || args.branch_weight.dtype() == args.weight.dtype();
}

}  // namespace

absl::Status CudaBackend::ResidualNormForward(const ops::ResidualNormArgs& args) {
  if (!ParameterDTypesAgree(args)) return ops::ComposedResidualNormForward(*this, args);
  const int64_t rows = ops::Rows(args.residual), cols = ops::Cols(args.residual);
  if (rows == 0) return absl::OkStatus();
  DispatchFloat(args.residual.dtype(), [&]<typename T>() {
    DispatchFloat(args.x.dtype(), [&]<typename X>() {
      DispatchFloat(args.weight.dtype(), [&]<typename W>() {
        const ForwardPointers<T, X, W> p{
            DevicePtr<X>(args.x),
            DevicePtr<T>(args.branch),
            DevicePtr<T>(args.residual),
            DevicePtr<T>(args.y),
            DevicePtr<T>(args.scratch),
            ArraysOf<W>(args.weight, args.bias, args.mean, args.rstd),
            ArraysOf<W>(args.branch_weight, args.branch_bias, args.branch_mean, args.branch_rstd)};
        Launch<ResidualNormForwardKernel<T, X, W>>(
            {static_cast<unsigned int>(rows), RowThreads(cols), 0, stream()}, p,
            DropoutMask::Of(args.dropout), cols, args.eps);
      });
    });
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::ResidualNormBackward(const ops::ResidualNormBackwardArgs& args) {
  if (!ParameterDTypesAgree(args)) return ops::ComposedResidualNormBackward(*this, args);
  const int64_t rows = ops::Rows(args.residual), cols = ops::Cols(args.residual);
  if (rows == 0) return absl::OkStatus();
  return DispatchFloat(args.residual.dtype(), [&]<typename T>() -> absl::Status {
    return DispatchFloat(args.weight.dtype(), [&]<typename W>() -> absl::Status {
      const BackwardPointers<T, W> p{
          DevicePtr<T>(args.dy),
          DevicePtr<T>(args.residual),
          DevicePtr<T>(args.branch),
          DevicePtr<T>(args.d_residual),
          DevicePtr<T>(args.d_branch),
          DevicePtr<T>(args.scratch),
          ArraysOf<W>(args.weight, Tensor(), args.mean, args.rstd),
          ArraysOf<W>(args.branch_weight, Tensor(), args.branch_mean, args.branch_rstd)};
      Launch<ResidualNormBackwardKernel<T, W>>(
          {static_cast<unsigned int>(rows), RowThreads(cols), 0, stream()}, p,
          DropoutMask::Of(args.dropout), cols);
      NF_CUDA_RETURN_IF_LAUNCH_FAILED();
      // The parameter gradients after the rows: dy is untouched and dz is in scratch.
      const LayerNormParamGradValues<T> norm{p.residual, p.dy, p.norm.mean, p.norm.rstd, cols};
      if (!args.norms_branch()) {
        return AddColumnSums<2>(context_, rows, cols, norm,
                                Outputs<2>{{args.dweight.data<float>(), args.dbias.data<float>()}});
      }
      const LayerNormParamGradValues<T> branch_norm{p.branch, p.scratch, p.branch_norm.mean,
                                                    p.branch_norm.rstd, cols};
      return AddColumnSums<4>(
          context_, rows, cols, BothParamGradValues<T>{norm, branch_norm},
          Outputs<4>{{args.dweight.data<float>(), args.dbias.data<float>(),
                      args.d_branch_weight.data<float>(), args.d_branch_bias.data<float>()}});
    });
  });
}

}  // namespace nf::cuda
