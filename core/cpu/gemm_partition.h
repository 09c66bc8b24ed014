// How the CPU GEMM cuts one ops::Gemm into single-threaded OpenBLAS calls for the thread pool:
// tiles of C (blocks of rows times blocks of columns) and, when K is long next to N, chunks of
// K whose partial products are added afterwards in chunk order.
//
// The cut depends on the shape only, never on the thread count: OpenBLAS 0.3.21 gives other
// bits for the same element of C when the call computing it has another shape (its small-matrix
// and edge kernels), so results are the same for any NF_NUM_THREADS only if every thread count
// makes the same calls. The thread count only decides which thread runs which task.
#pragma once

#include <cstdint>

namespace nf::cpu {

struct GemmPartition {
  int64_t rows_per_block = 0, row_blocks = 0;  // of C's m rows
  int64_t cols_per_block = 0, col_blocks = 0;  // of C's n columns
  int64_t k_per_chunk = 0, k_chunks = 0;       // of the inner dimension k

  int64_t tasks_per_batch() const { return row_blocks * col_blocks * k_chunks; }
};

// The partition of C[batch][m, n] = op(A)[m, k] op(B)[k, n]; m, n >= 1, k >= 0.
GemmPartition PartitionGemm(int64_t batch, int64_t m, int64_t n, int64_t k);

}  // namespace nf::cpu
