// The CPU GEMM's partition (core/cpu/gemm_partition.h): it covers C and K exactly, gives small-M
// GEMMs enough tasks for every core, and splits K only when K is long next to N.
#include "core/cpu/gemm_partition.h"

#include <array>
#include <cstdint>

#include "gtest/gtest.h"

namespace nf::cpu {
namespace {

void ExpectCovers(const GemmPartition& p, int64_t m, int64_t n, int64_t k) {
  EXPECT_GE(p.row_blocks * p.rows_per_block, m);
  EXPECT_LT((p.row_blocks - 1) * p.rows_per_block, m);
  EXPECT_GE(p.col_blocks * p.cols_per_block, n);
  EXPECT_LT((p.col_blocks - 1) * p.cols_per_block, n);
  EXPECT_GE(p.k_chunks * p.k_per_chunk, k);
  EXPECT_LT((p.k_chunks - 1) * p.k_per_chunk, k);
}

TEST(GemmPartitionTest, LargeMKeepsRowBlocksOnly) {
  // 8192 tokens through fc1 of the 125M shape: 32 row blocks are tasks enough.
  const GemmPartition p = PartitionGemm(1, 8192, 3072, 768);
  ExpectCovers(p, 8192, 3072, 768);
  EXPECT_EQ(p.row_blocks, 32);
  EXPECT_EQ(p.col_blocks, 1);
  EXPECT_EQ(p.k_chunks, 1);
}

TEST(GemmPartitionTest, SmallMSplitsColumns) {
  // The 125M LM head's logits: 128 tokens x 50304 vocabulary rows.
  const GemmPartition p = PartitionGemm(1, 128, 50304, 768);
  ExpectCovers(p, 128, 50304, 768);
  EXPECT_EQ(p.row_blocks, 1);
  EXPECT_GE(p.col_blocks, 16);
  EXPECT_EQ(p.k_chunks, 1);
  EXPECT_EQ(p.cols_per_block % 64, 0);
}

TEST(GemmPartitionTest, LongKSplitsK) {
  // The LM head's input gradient: [128, 768] from K = 50304.
  const GemmPartition p = PartitionGemm(1, 128, 768, 50304);
  ExpectCovers(p, 128, 768, 50304);
  EXPECT_EQ(p.col_blocks, 1);
  EXPECT_GE(p.k_chunks, 8);
  EXPECT_EQ(p.k_per_chunk % 1024, 0);
}

TEST(GemmPartitionTest, SmallWorkStaysOneTask) {
  const GemmPartition p = PartitionGemm(1, 64, 64, 64);
  ExpectCovers(p, 64, 64, 64);
  EXPECT_EQ(p.tasks_per_batch(), 1);
}

TEST(GemmPartitionTest, OneMicroBatchGetsTasksOfFewerThan16Cores) {
  // (m, n, k, tasks): the tiny model's fc1, fc2 and a [256, 128] x [128, 128] projection in two
  // 64-wide column blocks (256 tokens); the 125M shape's q/k/v in 128-wide column blocks (128
  // tokens).
  for (const auto& [m, n, k, tasks] : {std::array<int64_t, 4>{256, 512, 128, 4},
                                       {256, 128, 512, 2},
                                       {256, 128, 128, 2},
                                       {128, 768, 768, 6}}) {
    const GemmPartition p = PartitionGemm(1, m, n, k);
    ExpectCovers(p, m, n, k);
    EXPECT_EQ(p.tasks_per_batch(), tasks) << m << " " << n << " " << k;
  }
}

TEST(GemmPartitionTest, KChunksTopUpFewColumnBlocks) {
  // fc2 of the 125M shape: K = 3072 > 2 x 768 gives 3 chunks of 1024, then 128-wide columns.
  const GemmPartition p = PartitionGemm(1, 128, 768, 3072);
  ExpectCovers(p, 128, 768, 3072);
  EXPECT_EQ(p.k_chunks, 3);
  EXPECT_EQ(p.col_blocks, 6);
}

TEST(GemmPartitionTest, ZeroKIsOneChunk) {
  const GemmPartition p = PartitionGemm(1, 300, 200, 0);
  EXPECT_EQ(p.k_chunks, 1);
  EXPECT_EQ(p.tasks_per_batch(), p.row_blocks * p.col_blocks);
}

}  // namespace
}  // namespace nf::cpu
