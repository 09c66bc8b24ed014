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
// ...but no task under ~2 MFLOP (~16 us on one core at the ~125 GFLOP/s single-threaded sgemm
// reaches here), well above what handing a task to a spinning pool worker costs (~1 us,
// nf-bench-thread-pool). With 8 MFLOP, the tiny model's [256, 128] x [128, 128] projections ran
// on one core: 0.081-0.084 ms, against 0.045-0.050 ms in two column blocks.
constexpr int64_t kMinTaskFlops = 2'000'000;
// Column blocks are multiples of 64 and at least 128 wide unless C has at most 255 columns (then
// two blocks): each block re-packs all of A, so a 64-wide block pays twice the packing per FLOP
// of a 128-wide one (a [128, 768] x [768, 768] GEMM: 6 blocks of 128 columns, not 12 of 64).
constexpr int64_t kColAlign = 64;
constexpr int64_t kMinColsPerBlock = 128;
// K chunks are multiples of 1024: each adds a partial C to write and read back, which must be
// small next to the chunk's products (m x n x 1024 multiply-adds per m x n floats).
constexpr int64_t kKAlign = 1024;
// When the first split (columns, or K when K is long) leaves fewer tasks than this, the other
// tops it up; above it, more tasks would only fragment the work.
constexpr int64_t kTopUpBelow = 4;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Cuts `extent` into about `pieces` blocks whose length is a multiple of `align` and at least
// `min_length`; returns the block length (the last block may be shorter).
int64_t BlockLength(int64_t extent, int64_t pieces, int64_t align, int64_t min_length) {
  return std::max(min_length, CeilDiv(CeilDiv(extent, pieces), align) * align);
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
  // (m x n floats written, then read): split first the one that costs less, then the other
  // only if still short of tasks.
  const auto split_columns = [&](int64_t target) {
    const int64_t tasks = batch * p.tasks_per_batch();
    if (tasks >= target) return;
    const int64_t pieces =
        std::min(CeilDiv(wanted, tasks), std::max<int64_t>(2, n / kMinColsPerBlock));
    p.cols_per_block = BlockLength(n, pieces, kColAlign, kColAlign);
    p.col_blocks = CeilDiv(n, p.cols_per_block);
  };
  const auto split_k = [&](int64_t target) {
    const int64_t tasks = batch * p.tasks_per_batch();
    if (tasks >= target) return;
    p.k_per_chunk = BlockLength(k, CeilDiv(wanted, tasks), kKAlign, kKAlign);
    p.k_chunks = CeilDiv(k, p.k_per_chunk);
  };
  const int64_t top_up = std::min(wanted, kTopUpBelow);
  if (k > 2 * n) {
    split_k(wanted);
    split_columns(top_up);
  } else {
    split_columns(wanted);
    split_k(top_up);
  }
  return p;
}

}  // namespace nf::cpu
