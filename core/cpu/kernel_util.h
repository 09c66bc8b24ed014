// Helpers shared by the CPU kernels: dtype dispatch, parallel loops, fp32 staging buffers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/half.h"
#include "core/ops/checks.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace nf::cpu {

// Calls f.template operator()<T>() with T the C++ type of a floating dtype:
//   DispatchFloat(x.dtype(), [&]<typename T>() { ... x.data<T>() ... });
template <typename F>
decltype(auto) DispatchFloat(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF16:
      return f.template operator()<Half>();
    case DType::kBF16:
      return f.template operator()<BFloat16>();
    default:
      return f.template operator()<float>();
  }
}

// Parallel loop over [0, n) where one index costs about `work_per_index` flops; chunks are
// sized to at least ~32k flops so tiny loops stay on one thread.
template <typename F>
void ParallelFor(int64_t n, int64_t work_per_index, F&& fn) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_index));
  ThreadPool::Global().ParallelFor(n, grain, fn);
}

// Deterministic parallel sum: partials over fixed blocks of `block` indices, added in block
// order, so the result does not depend on the thread count. block_sum(begin, end) -> double.
template <typename F>
double BlockedSum(int64_t n, int64_t block, F&& block_sum) {
  const int64_t blocks = (n + block - 1) / block;
  std::vector<double> partial(blocks, 0.0);
  ParallelFor(blocks, block, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      partial[b] = block_sum(b * block, std::min(n, (b + 1) * block));
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

// src[0, n) as fp32 in `buffer` (or src itself when already fp32).
template <typename T>
const float* AsFloat(const T* src, int64_t n, std::vector<float>& buffer) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    buffer.resize(n);
    for (int64_t i = 0; i < n; ++i) buffer[i] = ToFloat(src[i]);
    return buffer.data();
  }
}

template <typename T>
void StoreFloats(const float* src, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FromFloat<T>(src[i]);
}

}  // namespace nf::cpu
