// Compiled once per ISA level (nf_add_isa_sources): see elementwise_kernels.h.
#include "core/cpu/isa/elementwise_kernels.h"

namespace nf::cpu::NF_ISA_NAMESPACE {
namespace {

void AddBias(float* x, const float* bias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

void SumRows(const float* dy, int64_t rows, int64_t cols, int64_t stride, double* sums) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = dy + r * stride;
    for (int64_t c = 0; c < cols; ++c) sums[c] += static_cast<double>(row[c]);
  }
}

}  // namespace

extern const ElementwiseKernels kElementwiseKernels;
const ElementwiseKernels kElementwiseKernels = {
    .add_bias = AddBias,
    .sum_rows = SumRows,
};

}  // namespace nf::cpu::NF_ISA_NAMESPACE
