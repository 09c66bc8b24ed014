// Compiled once per ISA level (nf_add_isa_sources): see norm_kernels.h. Shapes: x, dy, y, dx
// are row-major [rows, cols]; w, b [cols]; mean, rstd [rows].
#include "core/cpu/isa/norm_kernels.h"

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

void Forward(const float* x, const float* w, const float* b, int64_t rows, int64_t cols, float eps,
             float* y, float* mean, float* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    const double mu =
        cols > 0 ? LaneSum(cols, [&](int64_t c) { return double{row[c]}; }) / cols : 0.0;
    const double squares = LaneSum(cols, [&](int64_t c) {
      const double d = row[c] - mu;
      return d * d;
    });
    const double var = cols > 0 ? squares / cols : 0.0;
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
  // Two lane sets in one pass: sum g and sum g * xhat.
  double sum_g[kLanes] = {}, sum_g_xhat[kLanes] = {};
  const auto add = [&](int64_t c, int64_t l) {
    const double g = double{dy[c]} * w[c];
    sum_g[l] += g;
    sum_g_xhat[l] += g * Xhat(x[c], mean, rstd);
  };
  int64_t c = 0;
  for (; c + kLanes <= cols; c += kLanes) {
#pragma GCC unroll 1
    for (int64_t l = 0; l < kLanes; ++l) add(c + l, l);
  }
  for (int64_t l = 0; c + l < cols; ++l) add(c + l, l);
  sums[0] = CombineLanes(sum_g);
  sums[1] = CombineLanes(sum_g_xhat);
}

void InputGradRow(const float* x, const float* dy, const float* w, float mean, float rstd,
                  double mean_g, double mean_g_xhat, int64_t cols, float* dx) {
  for (int64_t c = 0; c < cols; ++c) {
    const double xhat = Xhat(x[c], mean, rstd);
    const double g = double{dy[c]} * w[c];
    dx[c] = static_cast<float>(rstd * (g - mean_g - xhat * mean_g_xhat));
  }
}

void ParamGradRows(const float* x, const float* dy, const float* mean, const float* rstd,
                   int64_t rows, int64_t cols, double* sum_w, double* sum_b) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const double g = dyr[c];
      sum_w[c] += g * Xhat(xr[c], mean[r], rstd[r]);
      sum_b[c] += g;
    }
  }
}

}  // namespace

const NormKernels kNormKernels = {
    .forward = Forward,
    .normalize = Normalize,
    .partial_stats = PartialStats,
    .backward_row_sums = BackwardRowSums,
    .input_grad_row = InputGradRow,
    .param_grad_rows = ParamGradRows,
};

}  // namespace nf::cpu::NF_ISA_NAMESPACE
