#include "core/cpu/gemm_partition.h"

#include <algorithm>

namespace nf::cpu {
namespace {

// Rows of C per block, as before columns and K were split too: single-threaded sgemm on 256
// rows ran at 0.95 of all-core sgemm on 2 cores (128 rows 0.86), and model-sized GEMMs
// (thousands of token rows) give a 16-core pool a task per thread from rows alone.
constexpr int64_t kRowsPerBlock = 256;
// Enough tasks for a 16-core pool when the work allows it...
constexpr int64_t kMaxTasks = 16;
// ...but no task under ~4 MFLOP (~40 us on one core), well above a pool wake-up (~10 us).
constexpr int64_t kMinTaskFlops = 4'000'000;
// Column blocks and K chunks are multiples of these: whole AVX-512 tiles, and K chunks long
// enough that adding a partial C costs little next to computing it.
constexpr int64_t kColAlign = 64;
constexpr int64_t kKAlign = 256;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Cuts `extent` into about `pieces` blocks whose length is a multiple of `align`; returns the
// block length (the last block may be shorter).
int64_t BlockLength(int64_t extent, int64_t pieces, int64_t align) {
  return std::max(align, CeilDiv(CeilDiv(extent, pieces), align) * align);
}

}  // namespace

GemmPartition PartitionGemm(int64_t batch, int64_t m, int64_t n, int64_t k) {
  GemmPartition p;
  p.rows_per_block = kRowsPerBlock;
  p.row_blocks = CeilDiv(m, kRowsPerBlock);
  p.cols_per_block = n;
  p.col_blocks = 1;
  p.k_per_chunk = k;
  p.k_chunks = 1;
  const double flops = 2.0 * static_cast<double>(batch) * m * n * k;
  const int64_t wanted =
      std::clamp(static_cast<int64_t>(flops / kMinTaskFlops), int64_t{1}, kMaxTasks);

  // A column block re-reads all of A (m x k more floats each), a K chunk adds a partial C
  // (m x n floats written, then read): split first the one that costs less.
  const auto split_columns = [&] {
    const int64_t tasks = batch * p.tasks_per_batch();
    if (tasks >= wanted) return;
    p.cols_per_block = BlockLength(n, CeilDiv(wanted, tasks), kColAlign);
    p.col_blocks = CeilDiv(n, p.cols_per_block);
  };
  const auto split_k = [&] {
    const int64_t tasks = batch * p.tasks_per_batch();
    if (tasks >= wanted) return;
    p.k_per_chunk = BlockLength(k, CeilDiv(wanted, tasks), kKAlign);
    p.k_chunks = CeilDiv(k, p.k_per_chunk);
  };
  if (k > 2 * n) {
    split_k();
    split_columns();
  } else {
    split_columns();
    split_k();
  }
  return p;
}

}  // namespace nf::cpu
