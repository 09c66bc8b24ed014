// GEMM on the CPU: single-threaded OpenBLAS sgemm over tiles of C and chunks of K
// (core/cpu/gemm_partition.h), the tasks spread over the thread pool. The partition depends only
// on the shapes, so every element is computed by the same calls, and K chunks are added in the
// same order, whatever the thread count. fp16/bf16 operands are widened to fp32 first, so
// products and sums are fp32 whatever the storage type (the contract of ops::Gemm). A few rows
// against a transposed fp16/bf16 B (decoding) take the skinny path instead (SkinnyProduct).
// The widenings are exact, so the path only decides the order of the fp32 sums.
#include <memory>

#include "core/cpu/blas.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/gemm_partition.h"
#include "core/cpu/isa/gemm_kernels.h"
#include "core/cpu/kernel_util.h"
#include "core/status.h"

namespace nf::cpu {
namespace {

struct Operand {
  const float* data;     // fp32 view of the whole operand
  int64_t batch_stride;  // elements between batches; 0 when shared by every batch
  int64_t ld;            // row-major leading dimension (the stored matrix's column count)
};

// Elements per task of a parallel widening: 256 KiB of fp32 output.
constexpr int64_t kWidenBlock = 64 * 1024;

// The kernel that widens T's bits (fp16 or bf16) to fp32.
template <typename T>
auto WidenKernel() {
  const GemmKernels& kernels = SelectedGemmKernels();
  return std::is_same_v<T, BFloat16> ? kernels.widen_bf16 : kernels.widen_f16;
}

// The fp32 view of operand `t`: t itself when fp32, else a copy widened into `buffer` by the
// vectorised kernels in parallel blocks. The buffer is not zeroed first (every element is
// written), and the pool's threads share its first touch: for a 2.7B-sized weight the serial
// widening into a zeroed vector took longer than the product (nf-bench-ops gemm_decode_bf16 at
// m = 32: 83-87 ms against 45-46 ms, paired runs; docs/performance.md).
template <typename T>
Operand Widen(const Tensor& t, std::unique_ptr<float[]>& buffer) {
  const int64_t rows = t.dim(-2), cols = t.dim(-1);
  const int64_t batch_stride = t.rank() == 3 ? rows * cols : 0;
  if constexpr (std::is_same_v<T, float>) {
    return {t.data<float>(), batch_stride, cols};
  } else {
    const int64_t n = t.numel();
    buffer = std::make_unique_for_overwrite<float[]>(n);
    const auto widen = WidenKernel<T>();
    const auto* src = reinterpret_cast<const uint16_t*>(t.data<T>());
    float* dst = buffer.get();
    ParallelFor((n + kWidenBlock - 1) / kWidenBlock, kWidenBlock, [&](int64_t begin, int64_t end) {
      for (int64_t block = begin; block < end; ++block) {
        const int64_t first = block * kWidenBlock;
        widen(src + first, std::min(kWidenBlock, n - first), dst + first);
      }
    });
    return {dst, batch_stride, cols};
  }
}

// The most rows of C the skinny path takes. nf-generate decodes one token at a time (m = 1).
// nf-bench-ops gemm_decode_bf16 ([m, 2560] x [10240, 2560]^T, 2 cores): the dots take 1.7, 3.6
// and 12-19 ms at m = 1, 4, 16, where widening B and sgemm take 37-44 ms. From 32 rows on the
// two are within this VM's noise (22-36 against 45-47 ms at 32, 44 against 51 at 64), and the
// dots' share grows with m while sgemm's products stay cheap (f32 B: 8.8 ms at 16, 12.8 at 32).
constexpr int64_t kSkinnyMaxRows = 16;

// Whether C = alpha A B^T + beta C takes the skinny path: 2-D, at most kSkinnyMaxRows rows, and B
// (a linear layer's [out, in] weight) stored in fp16 or bf16.
bool TakesSkinnyPath(const ops::GemmArgs& args) {
  return args.c.rank() == 2 && args.c.dim(0) <= kSkinnyMaxRows && args.trans_b &&
         args.b.dtype() != DType::kF32;
}

// The skinny path: op(A) [m, k] (A stored [m, k] or transposed [k, m]) widened once into rows
// of fp32, then every row j of B [n, k] widened into an L1-sized buffer and dotted with each row
// of A (GemmKernels::dot_rows), so B is read once in its 2-byte form. Each element of C is one
// fixed-lane fp32 sum, whichever thread computes it.
template <typename T>
void SkinnyProduct(const ops::GemmArgs& args) {
  const Tensor& c = args.c;
  const int64_t m = c.dim(0), n = c.dim(1);
  const int64_t k = args.b.dim(-1);  // B is [n, k], or [1, n, k] beside a 2-D C
  std::vector<float> a_rows(m * k);
  const T* a = args.a.data<T>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t l = 0; l < k; ++l) {
      a_rows[i * k + l] = ToFloat(args.trans_a ? a[l * m + i] : a[i * k + l]);
    }
  }
  const auto widen = WidenKernel<T>();
  const auto dot_rows = SelectedGemmKernels().dot_rows;
  const auto* b = reinterpret_cast<const uint16_t*>(args.b.data<T>());
  DispatchFloat(c.dtype(), [&]<typename C>() {
    C* out = c.data<C>();
    ParallelFor(n, 2 * m * k, [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> b_row;
      b_row.resize(k);
      float dots[kSkinnyMaxRows];
      for (int64_t j = begin; j < end; ++j) {
        widen(b + j * k, k, b_row.data());
        dot_rows(a_rows.data(), m, b_row.data(), k, dots);
        for (int64_t i = 0; i < m; ++i) {
          float value = args.alpha * dots[i];
          if (args.beta != 0.0f) value += args.beta * ToFloat(out[i * n + j]);
          out[i * n + j] = FromFloat<C>(value);
        }
      }
    });
  });
}

}  // namespace

absl::Status CpuBackend::Gemm(const ops::GemmArgs& args) {
  if (args.bias.defined()) {  // the product, then its own pass
    NF_RETURN_IF_ERROR(Gemm(args.WithoutBias()));
    return AddBias(args.c, args.bias);
  }
  const Tensor& c = args.c;
  const int64_t m = c.dim(-2), n = c.dim(-1);
  const int64_t k = args.trans_a ? args.a.dim(-2) : args.a.dim(-1);
  const int64_t batch = c.rank() == 3 ? c.dim(0) : 1;
  if (c.numel() == 0) return absl::OkStatus();
  if (TakesSkinnyPath(args)) {
    DispatchFloat(args.b.dtype(), [&]<typename T>() {
      if constexpr (!std::is_same_v<T, float>) SkinnyProduct<T>(args);
    });
    return absl::OkStatus();
  }

  std::unique_ptr<float[]> a_buffer, b_buffer;
  std::vector<float> c_buffer;
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

  const GemmPartition part = PartitionGemm(batch, m, n, k);
  // Chunk 0 of K accumulates into C with beta; chunk q > 0 writes its partial product to
  // partials[q - 1], a [batch, m, n] array, added to C in chunk order once all tasks are done.
  // Reused across calls: only GEMMs with a small C and a long K are chunked, so it stays small
  // (the 125M LM head's input gradient: 12 x 128 x 768 floats).
  // (Read through a pointer: inside the tasks, `partials` would name each worker's own.)
  thread_local std::vector<float> partials;
  const int64_t c_size = batch * m * n;
  if (part.k_chunks > 1) partials.resize((part.k_chunks - 1) * c_size);
  float* const partial_data = partials.data();

  const int64_t tiles_per_batch = part.row_blocks * part.col_blocks;
  const int64_t task_flops = 2 * part.rows_per_block * part.cols_per_block * part.k_per_chunk;
  ParallelFor(batch * part.tasks_per_batch(), task_flops, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t chunk = task / (batch * tiles_per_batch);
      const int64_t i = task / tiles_per_batch % batch;
      const int64_t tile = task % tiles_per_batch;
      const int64_t row = tile / part.col_blocks * part.rows_per_block;
      const int64_t col = tile % part.col_blocks * part.cols_per_block;
      const int64_t inner = chunk * part.k_per_chunk;
      const int64_t rows = std::min(part.rows_per_block, m - row);
      const int64_t cols = std::min(part.cols_per_block, n - col);
      const int64_t depth = std::min(part.k_per_chunk, k - inner);
      // Element (row, inner) of op(A) and (inner, col) of op(B), stored transposed or not.
      const float* a_tile =
          a.data + i * a.batch_stride + (args.trans_a ? inner * a.ld + row : row * a.ld + inner);
      const float* b_tile =
          b.data + i * b.batch_stride + (args.trans_b ? col * b.ld + inner : inner * b.ld + col);
      float* c_tile =
          (chunk == 0 ? c_data : partial_data + (chunk - 1) * c_size) + i * m * n + row * n + col;
      Sgemm(args.trans_a, args.trans_b, rows, cols, depth, args.alpha, a_tile, a.ld, b_tile, b.ld,
            chunk == 0 ? args.beta : 0.0f, c_tile, n);
    }
  });
  if (part.k_chunks > 1) {
    ParallelFor(batch * m, n * (part.k_chunks - 1), [&](int64_t begin, int64_t end) {
      for (int64_t q = 0; q < part.k_chunks - 1; ++q) {
        const float* partial = partial_data + q * c_size;
        for (int64_t j = begin * n; j < end * n; ++j) c_data[j] += partial[j];
      }
    });
  }

  DispatchFloat(c.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, float>) StoreFloats(c_data, c.numel(), c.data<T>());
  });
  return absl::OkStatus();
}

}  // namespace nf::cpu
