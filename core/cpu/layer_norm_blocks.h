// What the CPU LayerNorm (layer_norm.cc) and the fused ops around LayerNorms (activation_norm.cc,
// residual_norm.cc) share: the choice of the vectorised fp32 kernels, and the backward's
// parameter gradients. For those, rows are taken in fixed blocks of 64, each block sums its
// rows' terms per column (in Partial: float for the fp32 kernels, 64 terms a partial, double for
// the scalar fp16 / bf16 loops), then the blocks are added in order in double. Cache friendly,
// and the same bits for any thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
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

// A row's working buffers, one set per thread: [count, cols] floats (grown, never shrunk).
inline float* RowBuffers(int64_t count, int64_t cols) {
  thread_local std::vector<float> buffers;
  if (static_cast<int64_t>(buffers.size()) < count * cols) buffers.resize(count * cols);
  return buffers.data();
}

// For every block of kLayerNormRowsPerBlock rows [begin, end) of [0, rows): block_body(begin,
// end, sums), where sums [grads.size(), cols] are the block's Partial partials, one row per
// gradient (the body adds its rows' terms to them in row order); in parallel over the blocks,
// ~work_per_row flops a row. Then grads[g][c] += sums[g, c] over the blocks in block order. Each
// grad fp32 [cols].
template <typename Partial, typename BlockBody>
void ForEachBlockWithColumnGrads(int64_t rows, int64_t cols, int64_t work_per_row,
                                 std::initializer_list<Tensor> grads, BlockBody&& block_body) {
  const int64_t count = static_cast<int64_t>(grads.size());
  const int64_t blocks = (rows + kLayerNormRowsPerBlock - 1) / kLayerNormRowsPerBlock;
  // [blocks, count, cols]: each block's partials, one row per gradient.
  std::vector<Partial> partial(blocks * count * cols, Partial{0});
  ParallelFor(blocks, work_per_row * kLayerNormRowsPerBlock, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      block_body(block * kLayerNormRowsPerBlock,
                 std::min(rows, (block + 1) * kLayerNormRowsPerBlock),
                 partial.data() + block * count * cols);
    }
  });
  std::vector<double> total(count * cols, 0.0);
  for (int64_t block = 0; block < blocks; ++block) {
    const Partial* sums = partial.data() + block * count * cols;
    for (int64_t i = 0; i < count * cols; ++i) total[i] += sums[i];
  }
  int64_t g = 0;
  for (const Tensor& grad : grads) {
    float* out = grad.data<float>();
    for (int64_t c = 0; c < cols; ++c) out[c] += static_cast<float>(total[g * cols + c]);
    ++g;
  }
}

// One LayerNorm's parameter gradients: row_body(r, sum_w, sum_b) adds row r's dweight and dbias
// terms to its block's partials sum_w, sum_b [cols].
template <typename Partial, typename RowBody>
void ForEachRowWithParamGrads(int64_t rows, int64_t cols, int64_t work_per_row,
                              const Tensor& dweight, const Tensor& dbias, RowBody&& row_body) {
  ForEachBlockWithColumnGrads<Partial>(rows, cols, work_per_row, {dweight, dbias},
                                       [&](int64_t begin, int64_t end, Partial* sums) {
                                         for (int64_t r = begin; r < end; ++r) {
                                           row_body(r, sums, sums + cols);
                                         }
                                       });
}

}  // namespace nf::cpu
