// GEMM on the CPU: single-threaded OpenBLAS sgemm over blocks of C's rows, the blocks spread
// over the thread pool. Block boundaries depend only on the shapes, so every element is computed
// by the same call whatever the thread count. fp16/bf16 operands are widened to fp32 first, so
// products and sums are fp32 whatever the storage type (the contract of ops::Gemm).
#include "core/cpu/blas.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/kernel_util.h"

namespace nf::cpu {
namespace {

// Rows of C per task: large enough that single-threaded sgemm runs near its peak (128 rows
// measured 0.86 of all-core sgemm on 2 cores, 256 rows 0.95, 512 rows 0.98), small enough that
// model-sized GEMMs (thousands of token rows) give a 16-core pool a task per thread.
constexpr int64_t kRowsPerBlock = 256;

struct Operand {
  const float* data;     // fp32 view of the whole operand
  int64_t batch_stride;  // elements between batches; 0 when shared by every batch
  int64_t ld;            // row-major leading dimension (the stored matrix's column count)
};

template <typename T>
Operand Widen(const Tensor& t, std::vector<float>& buffer) {
  const int64_t rows = t.dim(-2), cols = t.dim(-1);
  return {AsFloat(t.data<T>(), t.numel(), buffer), t.rank() == 3 ? rows * cols : 0, cols};
}

}  // namespace

absl::Status CpuBackend::Gemm(const ops::GemmArgs& args) {
  const Tensor& c = args.c;
  const int64_t m = c.dim(-2), n = c.dim(-1);
  const int64_t k = args.trans_a ? args.a.dim(-2) : args.a.dim(-1);
  const int64_t batch = c.rank() == 3 ? c.dim(0) : 1;
  if (c.numel() == 0) return absl::OkStatus();

  std::vector<float> a_buffer, b_buffer, c_buffer;
  const Operand a =
      DispatchFloat(args.a.dtype(), [&]<typename T>() { return Widen<T>(args.a, a_buffer); });
  const Operand b =
      DispatchFloat(args.b.dtype(), [&]<typename T>() { return Widen<T>(args.b, b_buffer); });
  // C is computed in fp32: in place when it is fp32, else in a staging buffer.
  float* c_data = DispatchFloat(c.dtype(), [&]<typename T>() -> float* {
    if constexpr (std::is_same_v<T, float>) {
      return c.data<float>();
    } else {
      c_buffer.assign(c.numel(), 0.0f);
      if (args.beta != 0.0f) AsFloat(c.data<T>(), c.numel(), c_buffer);
      return c_buffer.data();
    }
  });

  const int64_t blocks_per_batch = (m + kRowsPerBlock - 1) / kRowsPerBlock;
  ParallelFor(batch * blocks_per_batch, 2 * kRowsPerBlock * n * k, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / blocks_per_batch;
      const int64_t row = (task % blocks_per_batch) * kRowsPerBlock;
      const int64_t rows = std::min(kRowsPerBlock, m - row);
      // Row `row` of op(A): a row of stored A, or a column when A is transposed.
      const float* a_rows = a.data + i * a.batch_stride + (args.trans_a ? row : row * a.ld);
      Sgemm(args.trans_a, args.trans_b, rows, n, k, args.alpha, a_rows, a.ld,
            b.data + i * b.batch_stride, b.ld, args.beta, c_data + i * m * n + row * n, n);
    }
  });

  DispatchFloat(c.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, float>) StoreFloats(c_data, c.numel(), c.data<T>());
  });
  return absl::OkStatus();
}

}  // namespace nf::cpu
