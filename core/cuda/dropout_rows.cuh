// Dropout's mask on the GPU by groups of 4 columns (nvcc only): one Philox call draws the words
// of global columns [4q, 4q + 4), which serve the local columns of the row that fall in that
// group, as the CPU draws them (core/philox.h). The Dropout kernel runs it over a grid, the fused
// kernels over one row per block.
#pragma once

#include <cstdint>

#include "core/cuda/kernel_util.cuh"
#include "core/ops/ops.h"
#include "core/philox.h"

namespace nf::cuda {

// A dropout spec with the constants of its mask, computed once on the host.
struct DropoutMask {
  ops::DropoutSpec spec;
  uint32_t threshold;  // a word >= threshold keeps its element
  float keep_scale;    // 1 / (1 - p)
  static DropoutMask Of(const ops::DropoutSpec& spec) {
    return {spec, DropoutThreshold(spec.p), 1.0f / (1.0f - spec.p)};
  }
  __host__ __device__ bool active() const { return spec.p > 0.0f; }
  // The groups of 4 global columns that local columns [0, cols) touch: [first_group, +count).
  __host__ __device__ int64_t first_group() const { return spec.col_offset >> 2; }
  __host__ __device__ int64_t groups(int64_t cols) const {
    return ((spec.col_offset + cols - 1) >> 2) - first_group() + 1;
  }
};

// y_row[c] = x_row[c] * keep_scale or 0 for the local columns c of global group `group` in local
// row r (token token_offset + r); y_row may be x_row.
template <typename T>
__device__ void DropoutGroup(const DropoutMask& mask, const T* x_row, T* y_row, int64_t r,
                             int64_t cols, int64_t group) {
  const ops::DropoutSpec& spec = mask.spec;
  const uint64_t sample = spec.first_sample + (spec.token_offset + r) / spec.seq_len;
  const uint64_t position = (spec.token_offset + r) % spec.seq_len;
  const PhiloxCounter words =
      DropoutWords(spec.seed, spec.site, sample, 0, position, static_cast<uint64_t>(group) * 4);
  for (int lane = 0; lane < 4; ++lane) {
    const int64_t c = group * 4 + lane - spec.col_offset;
    if (c < 0 || c >= cols) continue;
    y_row[c] =
        FromFloat<T>(words[lane] >= mask.threshold ? ToFloat(x_row[c]) * mask.keep_scale : 0.0f);
  }
}

// Row r by this block's threads, a group each in turn; without dropout (p = 0) a copy, as the
// Dropout op's. Threads read and write other threads' columns: synchronise before reading y_row.
template <typename T>
__device__ void DropoutRowInBlock(const DropoutMask& mask, const T* x_row, T* y_row, int64_t r,
                                  int64_t cols) {
  if (!mask.active()) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y_row[c] = x_row[c];
    return;
  }
  const int64_t groups = mask.groups(cols);
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    DropoutGroup(mask, x_row, y_row, r, cols, mask.first_group() + g);
  }
}

}  // namespace nf::cuda
