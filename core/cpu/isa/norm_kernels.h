// Vectorised fp32 LayerNorm kernels of the CPU backend (core/cpu/layer_norm.cc calls them when x
// and the weight are fp32; fp16 / bf16 keep the scalar loops). One table per ISA level
// (core/cpu/isa/isa.h). Reductions run over fixed lanes (core/cpu/isa/lanes.h), the same bits
// for any thread count. The forward's statistics are double: the row's mean and rstd within
// fp32 rounding for any row, its outputs the base of everything after. The backward computes in
// fp32, as PyTorch's and the CUDA backend's do: its row sums within (n / 32 + 5) roundings of fp32
// for a row of n (tests/core/norm_kernels_test.cc has the error model), at twice the vector
// width of double. The AVX2 and AVX-512 levels may contract a multiply and an add into one FMA:
// rounding only.
#pragma once

#include <cstdint>

#include "core/cpu/isa/isa.h"

namespace nf::cpu {

struct NormKernels {
  // For each row r of x [rows, cols]: mean[r] and rstd[r] = 1 / sqrt(var + eps) from one double
  // pass over the row shifted by its first element (sums of x - x[0] and its squares: exact for
  // rows with a large mean, at most log2(cols) bits of double lost to the shift), then
  // y[r, c] = (x[r, c] - mean[r]) * rstd[r] * w[c] + b[c] while the row is in cache.
  void (*forward)(const float* x, const float* w, const float* b, int64_t rows, int64_t cols,
                  float eps, float* y, float* mean, float* rstd);
  // y = (x - mean) * rstd * w + b for rows whose mean / rstd are given (tensor parallel).
  void (*normalize)(const float* x, const float* w, const float* b, const float* mean,
                    const float* rstd, int64_t rows, int64_t cols, float* y);
  // stats[2 r] = sum_c x[r, c], stats[2 r + 1] = sum_c x[r, c]^2, in double: one shard's part
  // of the tensor-parallel statistics.
  void (*partial_stats)(const float* x, int64_t rows, int64_t cols, double* stats);
  // One row of the backward, x and dy [cols]: sums[0] = sum g, sums[1] = sum g * xhat with
  // g = dy * w and xhat = (x - mean) * rstd, in fp32 lanes (returned as double, the type the
  // tensor-parallel all-reduce adds).
  void (*backward_row_sums)(const float* x, const float* dy, const float* w, float mean, float rstd,
                            int64_t cols, double* sums);
  // One row of the backward, given mean_g = mean(g) and mean_g_xhat = mean(g * xhat) over the
  // full (possibly tensor-parallel) row, in one fp32 pass: dx = rstd * (g - mean_g - xhat *
  // mean_g_xhat), and the row's parameter-gradient terms added to a row block's partials,
  // sum_w[c] += dy[c] * xhat[c] and sum_b[c] += dy[c].
  void (*input_and_param_grad_row)(const float* x, const float* dy, const float* w, float mean,
                                   float rstd, float mean_g, float mean_g_xhat, int64_t cols,
                                   float* dx, float* sum_w, float* sum_b);
};

NF_ISA_KERNEL_TABLES(NormKernels, kNormKernels, NormKernelsFor, Norm)

}  // namespace nf::cpu
