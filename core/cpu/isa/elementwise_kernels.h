// Vectorised fp32 elementwise kernels of the CPU backend (core/cpu/elementwise.cc calls them for
// fp32 tensors; fp16/bf16 keep the scalar loops). One table per ISA level (core/cpu/isa/isa.h).
// Every kernel works on a range of whole rows of a row-major [rows, cols] matrix, so the thread
// pool can split rows without changing any element's arithmetic.
#pragma once

#include <cstdint>

#include "core/cpu/isa/isa.h"

namespace nf::cpu {

struct ElementwiseKernels {
  // x[r, c] += bias[c] for rows [0, rows).
  void (*add_bias)(float* x, const float* bias, int64_t rows, int64_t cols);
  // sums[c] += dy[r * stride + c] for c in [0, cols), over rows [0, rows) in row order, in double
  // (a column block of the bias gradient: the same bits as a scalar loop over the rows).
  void (*sum_rows)(const float* dy, int64_t rows, int64_t cols, int64_t stride, double* sums);
};

namespace isa_baseline { extern const ElementwiseKernels kElementwiseKernels; }
namespace isa_avx2 { extern const ElementwiseKernels kElementwiseKernels; }
namespace isa_avx512 { extern const ElementwiseKernels kElementwiseKernels; }

// The table of SelectedIsa(), or of a given level (tests compare the levels).
inline const ElementwiseKernels& ElementwiseKernelsFor(Isa isa) {
  return TableFor(isa, isa_baseline::kElementwiseKernels, isa_avx2::kElementwiseKernels,
                  isa_avx512::kElementwiseKernels);
}
inline const ElementwiseKernels& Elementwise() {
  static const ElementwiseKernels& table = ElementwiseKernelsFor(SelectedIsa());
  return table;
}

}  // namespace nf::cpu
