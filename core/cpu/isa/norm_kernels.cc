// Compiled once per ISA level (nf_add_isa_sources): see norm_kernels.h. Shapes: x, dy, y, dx
// are row-major [rows, cols]; w, b [cols]; mean, rstd [rows].
#include "core/cpu/isa/norm_kernels.h"

#include <algorithm>
#include <cmath>

#include "core/cpu/isa/lanes.h"

namespace nf::cpu::NF_ISA_NAMESPACE {
namespace {

// (x - mean) * rstd in float, as the scalar kernels form xhat.
inline float Xhat(float x, float mean, float rstd) { return (x - mean) * rstd; }

void NormalizeRow(const float* x, const float* w, const float* b, float mean, float rstd,
                  int64_t cols, float* y) {
  for (int64_t c = 0; c < cols; ++c) y[c] = Xhat(x[c], mean, rstd) * w[c] + b[c];
}

// mean and variance of one row (cols = n >= 1) in one pass over the values shifted by the row's
// first element k: s1 = sum (x - k), s2 = sum (x - k)^2 in double, mean = k + s1 / n,
// var = s2 / n - (s1 / n)^2. The subtraction loses the bits of (mean - k)^2 / var, and
// (k - mean)^2 <= sum (x - mean)^2 = n var for any row: at most log2(n) bits. With the lane
// sums' n / 16 + 4 roundings, var is within (n / 16 + 4) (n + 1) 2^-53 relative: 2^-37 at
// n = 768, 2^-29 at 16384, below fp32's 2^-24 up to n = 2^16.
void RowStats(const float* row, int64_t cols, double& mean, double& var) {
  const double k = row[0];
  double s1[kLanes] = {}, s2[kLanes] = {};
  AddToLanes2(s1, s2, cols, [&](int64_t c, double& t1, double& t2) {
    const double d = row[c] - k;
    t1 = d;
    t2 = d * d;
  });
  const double shift = CombineLanes(s1) / cols;
  // Rounding can take s2 / n - shift^2 a hair below 0 for a constant-ish row.
  var = std::max(0.0, CombineLanes(s2) / cols - shift * shift);
  mean = k + shift;
}

void Forward(const float* x, const float* w, const float* b, int64_t rows, int64_t cols, float eps,
             float* y, float* mean, float* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    double mu = 0.0, var = 0.0;
    if (cols > 0) RowStats(row, cols, mu, var);
    mean[r] = static_cast<float>(mu);
    rstd[r] = static_cast<float>(1.0 / std::sqrt(var + eps));
    NormalizeRow(row, w, b, mean[r], rstd[r], cols, y + r * cols);
  }
}

void Normalize(const float* x, const float* w, const float* b, const float* mean, const float* rstd,
               int64_t rows, int64_t cols, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    NormalizeRow(x + r * cols, w, b, mean[r], rstd[r], cols, y + r * cols);
  }
}

void PartialStats(const float* x, int64_t rows, int64_t cols, double* stats) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    stats[2 * r] = LaneSum(cols, [&](int64_t c) { return double{row[c]}; });
    stats[2 * r + 1] = LaneSum(cols, [&](int64_t c) { return double{row[c]} * row[c]; });
  }
}

void BackwardRowSums(const float* x, const float* dy, const float* w, float mean, float rstd,
                     int64_t cols, double* sums) {
  float sum_g[kLanesOf<float>] = {}, sum_g_xhat[kLanesOf<float>] = {};
  AddToLanes2(sum_g, sum_g_xhat, cols, [&](int64_t c, float& g, float& g_xhat) {
    g = dy[c] * w[c];
    g_xhat = g * Xhat(x[c], mean, rstd);
  });
  sums[0] = CombineLanes(sum_g);
  sums[1] = CombineLanes(sum_g_xhat);
}

// One pass over a row: its input gradient and its share of the parameter gradients.
// The partials are the row block's own (core/cpu/layer_norm_blocks.h), never any other
// argument: __restrict__ says so, else GCC gives up on the alias checks of six float pointers
// and leaves the loop scalar. dx may be dy (in place): it is read and written at the same index.
void InputAndParamGradRow(const float* x, const float* dy, const float* w, float mean, float rstd,
                          float mean_g, float mean_g_xhat, int64_t cols, float* dx,
                          float* __restrict__ sum_w, float* __restrict__ sum_b) {
  for (int64_t c = 0; c < cols; ++c) {
    const float xhat = Xhat(x[c], mean, rstd);
    dx[c] = rstd * (dy[c] * w[c] - mean_g - xhat * mean_g_xhat);
    sum_w[c] += dy[c] * xhat;
    sum_b[c] += dy[c];
  }
}

}  // namespace

const NormKernels kNormKernels = {
    .forward = Forward,
    .normalize = Normalize,
    .partial_stats = PartialStats,
    .backward_row_sums = BackwardRowSums,
    .input_and_param_grad_row = InputAndParamGradRow,
};

}  // namespace nf::cpu::NF_ISA_NAMESPACE
