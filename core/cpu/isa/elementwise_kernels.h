// Vectorised fp32 elementwise kernels of the CPU backend (core/cpu/elementwise.cc, layout.cc and
// attention.cc call them for fp32 tensors; fp16/bf16 keep the scalar loops). One table per ISA
// level (core/cpu/isa/isa.h). Every kernel works on a range of whole rows, or of independent
// elements, so the thread pool can split the work without changing any element's arithmetic:
// an element's result is the same in a loop's vector body and in its scalar remainder.
#pragma once

#include <cstdint>

#include "core/cpu/isa/isa.h"
#include "core/philox.h"

namespace nf::cpu {

// y = f(x) and dx = dy f'(x) over n elements; y may be x, dx may be dy. value_and_derivative
// gives both f(x) and f'(x) in one pass (sharing erf and exp), with forward's bits for y and
// bits for dydx such that dy * dydx[i] is backward's dx[i]: a backward that needs the
// activation's output recomputes it for the cost of the derivative alone.
struct ActivationKernels {
  void (*forward)(const float* x, float* y, int64_t n);
  void (*backward)(const float* x, const float* dy, float* dx, int64_t n);
  void (*value_and_derivative)(const float* x, float* y, float* dydx, int64_t n);
};

// One row of Philox dropout (core/philox.h): element c of the row has the global coordinates
// (sample, head, row, first_col + c), taken as DropoutWords takes them (the counter keeps 32
// bits of each), and is kept, times keep_scale, when its word is >= threshold
// (DropoutThreshold), else set to +0: the scalar loop's mask and values, bit for bit.
struct DropoutRowArgs {
  uint32_t seed, site;
  uint64_t sample, head, row, first_col;
  uint32_t threshold;
  float keep_scale;
};

struct ElementwiseKernels {
  // x[r, c] += bias[c] for rows [0, rows).
  void (*add_bias)(float* x, const float* bias, int64_t rows, int64_t cols);
  // sums[c] += dy[r * stride + c] for c in [0, cols), over rows [0, rows) in row order, in double
  // (a column block of the bias gradient: the same bits as a scalar loop over the rows).
  void (*sum_rows)(const float* dy, int64_t rows, int64_t cols, int64_t stride, double* sums);
  // sums[c] += a[r * stride + c] * b[r * stride + c] in double (the products are exact), over
  // rows [0, rows) in row order: sum_rows of a product.
  void (*sum_rows_product)(const float* a, const float* b, int64_t rows, int64_t cols,
                           int64_t stride, double* sums);
  // y[r, c] = x[r, c] * scale[c] for rows [0, rows); y may be x.
  void (*scale_columns)(const float* x, const float* scale, float* y, int64_t rows, int64_t cols);
  // y[i] = alpha * x[i] over n elements; y may be x.
  void (*scale)(const float* x, float alpha, float* y, int64_t n);
  // y[i] += alpha * x[i] over n elements (x and y distinct or equal).
  void (*axpy)(float alpha, const float* x, float* y, int64_t n);
  // Exact GELU x Phi(x), the tanh GELU and ReLU^2 (ops::Activation).
  ActivationKernels gelu, gelu_tanh, relu_squared;
  // Dropout of one row of n elements, x to y (y may be x).
  void (*dropout_row)(const DropoutRowArgs& args, const float* x, float* y, int64_t n);
  // y = x * m where m != 0, else +0, with m the multipliers dropout_row wrote for a row of ones
  // (keep_scale or +0): that row's dropout again, bit for bit, without the Philox words (y may
  // be x).
  void (*apply_dropout_multipliers)(const float* multipliers, const float* x, float* y, int64_t n);
};

NF_ISA_KERNEL_TABLES(ElementwiseKernels, kElementwiseKernels, ElementwiseKernelsFor, Elementwise)

}  // namespace nf::cpu
