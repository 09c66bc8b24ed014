// What the CPU LayerNorm (layer_norm.cc) and the fused activation + LayerNorm
// (activation_norm.cc) share: the choice of the vectorised fp32 kernels, and the backward's
// parameter gradients. For those, rows are taken in fixed blocks of 64, each block sums its
// rows' terms per column (in Partial: float for the fp32 kernels, 64 terms a partial, double for
// the scalar fp16 / bf16 loops), then the blocks are added in order in double. Cache friendly,
// and the same bits for any thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/kernel_util.h"
#include "core/tensor.h"

namespace nf::cpu {

inline constexpr int64_t kLayerNormRowsPerBlock = 64;

// Whether the vectorised fp32 kernels (core/cpu/isa/norm_kernels.h) apply: fp32 x and weight;
// other dtypes take the scalar loops.
inline bool UsesF32Kernels(const Tensor& x, const Tensor& weight) {
  return x.dtype() == DType::kF32 && weight.dtype() == DType::kF32;
}

// For every row r of [0, rows): row_body(r, sum_w, sum_b), where sum_w and sum_b [cols] are the
// Partial partials of r's block (the row adds its dweight and dbias terms to them); in parallel
// over the blocks, ~work_per_row flops each. Then dweight[c] += sum_w[c] and dbias[c] +=
// sum_b[c] over the blocks in block order. dweight, dbias fp32 [cols].
template <typename Partial, typename RowBody>
void ForEachRowWithParamGrads(int64_t rows, int64_t cols, int64_t work_per_row,
                              const Tensor& dweight, const Tensor& dbias, RowBody&& row_body) {
  const int64_t blocks = (rows + kLayerNormRowsPerBlock - 1) / kLayerNormRowsPerBlock;
  // [blocks, 2, cols]: each block's sum_w, then its sum_b.
  std::vector<Partial> partial(blocks * 2 * cols, Partial{0});
  ParallelFor(blocks, work_per_row * kLayerNormRowsPerBlock, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      Partial* sum_w = partial.data() + block * 2 * cols;
      const int64_t last = std::min(rows, (block + 1) * kLayerNormRowsPerBlock);
      for (int64_t r = block * kLayerNormRowsPerBlock; r < last; ++r) {
        row_body(r, sum_w, sum_w + cols);
      }
    }
  });
  std::vector<double> total_w(cols, 0.0), total_b(cols, 0.0);
  for (int64_t block = 0; block < blocks; ++block) {
    const Partial* block_w = partial.data() + block * 2 * cols;
    for (int64_t c = 0; c < cols; ++c) {
      total_w[c] += block_w[c];
      total_b[c] += block_w[cols + c];
    }
  }
  float* dw = dweight.data<float>();
  float* db = dbias.data<float>();
  for (int64_t c = 0; c < cols; ++c) {
    dw[c] += static_cast<float>(total_w[c]);
    db[c] += static_cast<float>(total_b[c]);
  }
}

}  // namespace nf::cpu
