// The row steps of a LayerNorm on the GPU, one thread block per row (nvcc only): statistics,
// normalisation, the backward's row sums and input gradient. The LayerNorm kernels and the fused
// kernels that contain a LayerNorm (residual_norm.cu) share them, so both take the same threads
// per row, visit the columns in the same order and reduce in the same order: the fused results
// are the unfused ones bit for bit.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/cuda/column_sums.cuh"
#include "core/cuda/kernel_util.cuh"

namespace nf::cuda {

// Threads per row: a warp for narrow rows, up to 256 for the widest (d_model 2560 fp32 is 10
// elements per thread).
inline unsigned int RowThreads(int64_t cols) {
  const int64_t warps = (cols + 31) / 32;
  return static_cast<unsigned int>(std::min<int64_t>(8, std::max<int64_t>(1, warps)) * 32);
}

struct RowStatistics {
  float mean, rstd;
};

// The mean and 1 / sqrt(var + eps) of this block's row x [cols], in two passes (mean, then
// centred squares): exact for rows with a large mean. Every thread gets them.
template <typename T>
__device__ RowStatistics RowStatisticsOf(const T* x, int64_t cols, float eps, float* scratch) {
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += ToFloat(x[c]);
  const float mean = BlockSum(sum, scratch) / static_cast<float>(cols);
  float squares = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = ToFloat(x[c]) - mean;
    squares += d * d;
  }
  const float var = BlockSum(squares, scratch) / static_cast<float>(cols);
  return {mean, rsqrtf(var + eps)};
}

// y[c] = xhat * weight[c] + bias[c] in fp32 (before rounding to the output type).
template <typename T, typename W>
__device__ __forceinline__ float NormalizedValue(const T* x, const W* weight, const W* bias,
                                                 int64_t c, float mean, float rstd) {
  const float xhat = (ToFloat(x[c]) - mean) * rstd;
  return xhat * ToFloat(weight[c]) + ToFloat(bias[c]);
}

template <typename T, typename W>
__device__ void NormalizeRow(const T* x, const W* weight, const W* bias, T* y, int64_t cols,
                             float mean, float rstd) {
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    y[c] = FromFloat<T>(NormalizedValue(x, weight, bias, c, mean, rstd));
  }
}

struct RowSums {
  float g, g_xhat;
};

// (sum g, sum g * xhat) over this block's row, g = dy * w.
template <typename T, typename W>
__device__ RowSums BackwardRowSums(const T* x, const T* dy, const W* weight, int64_t cols,
                                   float mean, float rstd, float* scratch) {
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = ToFloat(dy[c]) * ToFloat(weight[c]);
    sum_g += g;
    sum_g_xhat += g * ((ToFloat(x[c]) - mean) * rstd);
  }
  const float total_g = BlockSum(sum_g, scratch);
  const float total_g_xhat = BlockSum(sum_g_xhat, scratch);
  return {total_g, total_g_xhat};
}

// dx[c] = rstd * (g - mean(g) - xhat * mean(g * xhat)) in fp32, the means over the full feature
// dimension.
template <typename T, typename W>
__device__ __forceinline__ float InputGradValue(const T* x, const T* dy, const W* weight, int64_t c,
                                                float mean, float rstd, float mean_g,
                                                float mean_g_xhat) {
  const float xhat = (ToFloat(x[c]) - mean) * rstd;
  const float g = ToFloat(dy[c]) * ToFloat(weight[c]);
  return rstd * (g - mean_g - xhat * mean_g_xhat);
}

// dx [cols] of the row; dx may be dy (each element is read before it is written, by one thread).
template <typename T, typename W>
__device__ void InputGradRow(const T* x, const T* dy, const W* weight, T* dx, int64_t cols,
                             float mean, float rstd, float mean_g, float mean_g_xhat) {
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    dx[c] = FromFloat<T>(InputGradValue(x, dy, weight, c, mean, rstd, mean_g, mean_g_xhat));
  }
}

// (dy * xhat, dy) of element (r, c), summed over rows into the weight and bias gradients by
// AddColumnSums.
template <typename T>
struct LayerNormParamGradValues {
  const T* x;
  const T* dy;
  const float* mean;
  const float* rstd;
  int64_t cols;
  __device__ Values<2> operator()(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    const float g = ToFloat(dy[i]);
    return {{g * ((ToFloat(x[i]) - mean[r]) * rstd[r]), g}};
  }
};

}  // namespace nf::cuda
