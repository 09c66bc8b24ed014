// Deterministic column sums on the GPU: out_k[c] += sum over rows r of value(r, c)[k], for the
// parameter gradients that sum over tokens (bias, LayerNorm weight and bias, per-feature
// scales). Two passes without atomics: blocks of 32 columns x a chunk of rows write partial
// sums, then one thread per column adds the chunks in order. The partition depends only on
// the shape, so a gradient repeats bit for bit run to run.
#pragma once

#include <array>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_context.h"
#include "core/cuda/kernel_util.cuh"
#include "core/status.h"
#include "core/tensor.h"

namespace nf::cuda {

constexpr int kColumnTile = 32;  // columns per block: one warp reads 32 consecutive elements
constexpr int kRowLanes = 8;     // rows in flight per block

// value(r, c) returns std::array<float, K>-like `Values`.
template <int K>
struct Values {
  float v[K];
};

// partial [chunks, K, cols]
template <int K, typename ValueFn>
__global__ void ColumnPartialSums(int64_t rows, int64_t cols, int64_t rows_per_chunk, ValueFn value,
                                  float* partial) {
  __shared__ float tile[K][kRowLanes][kColumnTile];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = min(rows, begin + rows_per_chunk);
  float acc[K] = {};
  if (c < cols) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      const Values<K> v = value(r, c);
      for (int k = 0; k < K; ++k) acc[k] += v.v[k];
    }
  }
  for (int k = 0; k < K; ++k) tile[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int k = 0; k < K; ++k) {
      float sum = 0.0f;
      for (int lane = 0; lane < kRowLanes; ++lane) sum += tile[k][lane][threadIdx.x];
      partial[(static_cast<int64_t>(blockIdx.y) * K + k) * cols + c] = sum;
    }
  }
}

template <int K>
struct Outputs {
  float* out[K];
};

template <int K>
__global__ void AddColumnPartials(int64_t chunks, int64_t cols, const float* partial,
                                  Outputs<K> outputs) {
  NF_GRID_STRIDE_LOOP(c, cols) {
    for (int k = 0; k < K; ++k) {
      float sum = 0.0f;
      for (int64_t chunk = 0; chunk < chunks; ++chunk) sum += partial[(chunk * K + k) * cols + c];
      outputs.out[k][c] += sum;
    }
  }
}

// outputs[k][c] (fp32 device arrays of `cols`) += sum over rows of value(r, c).v[k].
template <int K, typename ValueFn>
absl::Status AddColumnSums(CudaContext& context, int64_t rows, int64_t cols, ValueFn value,
                           Outputs<K> outputs) {
  if (rows == 0 || cols == 0) return absl::OkStatus();
  // Enough chunks to fill the GPU for thin matrices, at least 64 rows each.
  const int64_t column_blocks = (cols + kColumnTile - 1) / kColumnTile;
  const int64_t wanted_chunks = std::max<int64_t>(1, 1024 / column_blocks);
  const int64_t rows_per_chunk = std::max<int64_t>(64, (rows + wanted_chunks - 1) / wanted_chunks);
  const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  NF_ASSIGN_OR_RETURN(Tensor partial,
                      Tensor::Empty(DType::kF32, {chunks, K, cols}, context.allocator()));
  const dim3 grid(static_cast<unsigned int>(column_blocks), static_cast<unsigned int>(chunks));
  Launch<ColumnPartialSums<K, ValueFn>>({grid, dim3(kColumnTile, kRowLanes), 0, context.stream()},
                                        rows, cols, rows_per_chunk, value, partial.data<float>());
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  Launch<AddColumnPartials<K>>({GridFor(cols), kThreads, 0, context.stream()}, chunks, cols,
                               partial.data<float>(), outputs);
  NF_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace nf::cuda
