// LayerNorm on the GPU, local and tensor-parallel: one block per row for the row statistics,
// normalisation and input gradient; the weight and bias gradients as deterministic column sums
// over rows (column_sums.cuh). As on the CPU, the tensor-parallel variants differ only in
// where the row statistics come from.
#include "core/cuda/column_sums.cuh"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_util.cuh"
#include "core/cuda/layer_norm_rows.cuh"
#include "core/ops/checks.h"

namespace nf::cuda {
namespace {

template <typename T, typename W>
__global__ void LayerNormForwardKernel(const T* x, const W* weight, const W* bias, T* y,
                                       float* mean_out, float* rstd_out, int64_t cols, float eps) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const T* row = x + r * cols;
  const RowStatistics stats = RowStatisticsOf(row, cols, eps, scratch);
  if (threadIdx.x == 0) {
    mean_out[r] = stats.mean;
    rstd_out[r] = stats.rstd;
  }
  NormalizeRow(row, weight, bias, y + r * cols, cols, stats.mean, stats.rstd);
}

// stats [rows, 2] = (sum x, sum x^2) in double, as the CPU (the all-reduced sums must keep
// E[x^2] - mean^2 exact to fp32 level).
template <typename T>
__global__ void PartialStatsKernel(const T* x, double* stats, int64_t cols) {
  __shared__ double scratch[32];
  const int64_t r = blockIdx.x;
  double sum = 0.0, squares = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const double v = ToFloat(x[r * cols + c]);
    sum += v;
    squares += v * v;
  }
  sum = BlockSum(sum, scratch);
  squares = BlockSum(squares, scratch);
  if (threadIdx.x == 0) {
    stats[2 * r] = sum;
    stats[2 * r + 1] = squares;
  }
}

template <typename T, typename W>
__global__ void ForwardFromStatsKernel(const T* x, const W* weight, const W* bias, T* y,
                                       float* mean_out, float* rstd_out, const double* stats,
                                       int64_t cols, int64_t total_cols, float eps) {
  const int64_t r = blockIdx.x;
  const double mu = stats[2 * r] / total_cols;
  // E[x^2] - mean^2 can come out slightly negative from rounding: clamp at 0.
  const double var = fmax(0.0, stats[2 * r + 1] / total_cols - mu * mu);
  const float mean = static_cast<float>(mu);
  const float rstd = static_cast<float>(1.0 / sqrt(var + eps));
  if (threadIdx.x == 0) {
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
  NormalizeRow(x + r * cols, weight, bias, y + r * cols, cols, mean, rstd);
}

template <typename T, typename W>
struct BackwardPointers {
  const T* x;
  const T* dy;
  const W* weight;
  const float* mean;
  const float* rstd;
  T* dx;
};

template <typename T, typename W>
BackwardPointers<T, W> PointersOf(const ops::LayerNormBackwardArgs& args) {
  return {DevicePtr<T>(args.x),    DevicePtr<T>(args.dy),   DevicePtr<W>(args.weight),
          args.mean.data<float>(), args.rstd.data<float>(), DevicePtr<T>(args.dx)};
}

template <typename T, typename W>
__global__ void LayerNormBackwardKernel(BackwardPointers<T, W> p, int64_t cols) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, offset = r * cols;
  const float mean = p.mean[r], rstd = p.rstd[r];
  const RowSums sums =
      BackwardRowSums(p.x + offset, p.dy + offset, p.weight, cols, mean, rstd, scratch);
  InputGradRow(p.x + offset, p.dy + offset, p.weight, p.dx + offset, cols, mean, rstd,
               sums.g / cols, sums.g_xhat / cols);
}

template <typename T, typename W>
__global__ void BackwardPartialSumsKernel(BackwardPointers<T, W> p, float* out, int64_t cols) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, offset = r * cols;
  const RowSums sums =
      BackwardRowSums(p.x + offset, p.dy + offset, p.weight, cols, p.mean[r], p.rstd[r], scratch);
  if (threadIdx.x == 0) {
    out[2 * r] = sums.g;
    out[2 * r + 1] = sums.g_xhat;
  }
}

template <typename T, typename W>
__global__ void BackwardFromSumsKernel(BackwardPointers<T, W> p, const float* sums, int64_t cols,
                                       int64_t total_cols) {
  const int64_t r = blockIdx.x, offset = r * cols;
  InputGradRow(p.x + offset, p.dy + offset, p.weight, p.dx + offset, cols, p.mean[r], p.rstd[r],
               sums[2 * r] / total_cols, sums[2 * r + 1] / total_cols);
}

template <typename T>
absl::Status AddParamGrads(CudaContext& context, const ops::LayerNormBackwardArgs& args) {
  const int64_t cols = ops::Cols(args.x);
  return AddColumnSums<2>(
      context, ops::Rows(args.x), cols,
      LayerNormParamGradValues<T>{DevicePtr<T>(args.x), DevicePtr<T>(args.dy),
                                  args.mean.data<float>(), args.rstd.data<float>(), cols},
      Outputs<2>{{args.dweight.data<float>(), args.dbias.data<float>()}});
}

template <typename F>
decltype(auto) DispatchLayerNorm(const Tensor& x, const Tensor& weight, F&& f) {
  return DispatchFloat(x.dtype(), [&]<typename T>() {
    return DispatchFloat(weight.dtype(),
                         [&]<typename W>() { return f.template operator()<T, W>(); });
  });
}

}  // namespace

absl::Status CudaBackend::LayerNormForward(const ops::LayerNormArgs& args) {
  const int64_t rows = ops::Rows(args.x), cols = ops::Cols(args.x);
  if (rows == 0) return absl::OkStatus();
  DispatchLayerNorm(args.x, args.weight, [&]<typename T, typename W>() {
    Launch<LayerNormForwardKernel<T, W>>(
        {static_cast<unsigned int>(rows), RowThreads(cols), 0, stream()}, DevicePtr<T>(args.x),
        DevicePtr<W>(args.weight), DevicePtr<W>(args.bias), DevicePtr<T>(args.y),
        args.mean.data<float>(), args.rstd.data<float>(), cols, args.eps);
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::LayerNormPartialStats(const Tensor& x, const Tensor& stats) {
  const int64_t rows = ops::Rows(x), cols = ops::Cols(x);
  if (rows == 0) return absl::OkStatus();
  DispatchFloat(x.dtype(), [&]<typename T>() {
    Launch<PartialStatsKernel<T>>({static_cast<unsigned int>(rows), RowThreads(cols), 0, stream()},
                                  DevicePtr<T>(x), stats.data<double>(), cols);
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::LayerNormForwardFromStats(const ops::LayerNormArgs& args,
                                                    const Tensor& stats, int64_t total_cols) {
  const int64_t rows = ops::Rows(args.x), cols = ops::Cols(args.x);
  if (rows == 0) return absl::OkStatus();
  DispatchLayerNorm(args.x, args.weight, [&]<typename T, typename W>() {
    Launch<ForwardFromStatsKernel<T, W>>(
        {static_cast<unsigned int>(rows), RowThreads(cols), 0, stream()}, DevicePtr<T>(args.x),
        DevicePtr<W>(args.weight), DevicePtr<W>(args.bias), DevicePtr<T>(args.y),
        args.mean.data<float>(), args.rstd.data<float>(), stats.data<double>(), cols, total_cols,
        args.eps);
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::LayerNormBackward(const ops::LayerNormBackwardArgs& args) {
  const int64_t rows = ops::Rows(args.x), cols = ops::Cols(args.x);
  if (rows == 0) return absl::OkStatus();
  return DispatchLayerNorm(args.x, args.weight, [&]<typename T, typename W>() -> absl::Status {
    // Parameter gradients first: dx may overwrite dy.
    NF_RETURN_IF_ERROR(AddParamGrads<T>(context_, args));
    Launch<LayerNormBackwardKernel<T, W>>(
        {static_cast<unsigned int>(rows), RowThreads(cols), 0, stream()}, PointersOf<T, W>(args),
        cols);
    NF_CUDA_RETURN_IF_LAUNCH_FAILED();
    return absl::OkStatus();
  });
}

absl::Status CudaBackend::LayerNormBackwardPartialSums(const ops::LayerNormBackwardArgs& args,
                                                       const Tensor& sums) {
  const int64_t rows = ops::Rows(args.x), cols = ops::Cols(args.x);
  if (rows == 0) return absl::OkStatus();
  DispatchLayerNorm(args.x, args.weight, [&]<typename T, typename W>() {
    Launch<BackwardPartialSumsKernel<T, W>>(
        {static_cast<unsigned int>(rows), RowThreads(cols), 0, stream()}, PointersOf<T, W>(args),
        sums.data<float>(), cols);
  });
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status CudaBackend::LayerNormBackwardFromSums(const ops::LayerNormBackwardArgs& args,
                                                    const Tensor& sums, int64_t total_cols) {
  const int64_t rows = ops::Rows(args.x), cols = ops::Cols(args.x);
  if (rows == 0) return absl::OkStatus();
  return DispatchLayerNorm(args.x, args.weight, [&]<typename T, typename W>() -> absl::Status {
    NF_RETURN_IF_ERROR(AddParamGrads<T>(context_, args));
    Launch<BackwardFromSumsKernel<T, W>>(
        {static_cast<unsigned int>(rows), RowThreads(cols), 0, stream()}, PointersOf<T, W>(args),
        sums.data<float>(), cols, total_cols);
    NF_CUDA_RETURN_IF_LAUNCH_FAILED();
    return absl::OkStatus();
  });
}

}  // namespace nf::cuda
