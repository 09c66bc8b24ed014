// The GPU runtime's own memory in the estimate (launcher/memory_estimate.h) that nf-launch's
// pre-check and nf-plan compare with a GPU: the cuBLASLt workspace, NCCL's buffers per
// communicator of more than one rank, and the dP workspace of cuDNN's deterministic attention
// backward. Without them a layout the check accepted could run out of memory at the first
// backward (issue 46, 4.4). The figures are the stated ones, on the shipped configs' shapes.
#include "launcher/memory_estimate.h"

#include <sstream>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/dry_run.h"
#include "launcher/memory_check.h"
#include "test_util.h"

namespace nf::launcher {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// deploy/configs/normformer-125m.pbtxt's shape: 12 heads of 64, 2048 tokens, micro-batch 16,
// fp16 (built here, as the test runs outside the source tree).
TrainConfig Config125m(TrainOptions::Device device) {
  TrainConfig config;
  model::ModelConfig& m = *config.mutable_model();
  m.set_num_layers(12);
  m.set_d_model(768);
  m.set_num_heads(12);
  m.set_ffn_dim(3072);
  m.set_vocab_size(50257);
  m.set_max_seq_len(2048);
  TrainOptions& t = *config.mutable_train();
  t.set_seq_len(2048);
  t.set_micro_batch_size(16);
  t.set_global_batch_size(256);
  t.set_precision(TrainOptions::FP16);
  t.set_recompute(TrainOptions::FULL);
  t.set_device(device);
  return config;
}

// deploy/configs/normformer-2.7b.pbtxt's: 32 heads of 80, micro-batch 4, run at tp 2.
TrainConfig Config27b(TrainOptions::Device device) {
  TrainConfig config = Config125m(device);
  model::ModelConfig& m = *config.mutable_model();
  m.set_num_layers(32);
  m.set_d_model(2560);
  m.set_num_heads(32);
  m.set_ffn_dim(10240);
  config.mutable_train()->set_micro_batch_size(4);
  config.mutable_train()->set_global_batch_size(512);
  config.mutable_parallel()->set_tensor_parallel(2);
  return config;
}

std::vector<PipelineRankMemory> Estimate(const TrainConfig& config, int world) {
  auto ranks = EstimateMemory(config, world);
  EXPECT_TRUE(ranks.ok()) << ranks.status();
  return ranks.ok() ? *ranks : std::vector<PipelineRankMemory>{};
}

double ModelShare(const PipelineRankMemory& r) {
  return r.parameter_bytes + r.gradient_bytes + r.optimizer_bytes + r.activation_bytes +
         r.buffer_bytes;
}

TEST(GpuRuntimeMemoryTest, StatedFigures) {
  // NCCL's default buffers: Simple 4 MiB, LL128 120 x 640 x 8 x 8 bytes, LL 8 x 512 x 8 x 16
  // bytes, per channel, on 32 channels.
  EXPECT_EQ(kNcclSimpleBufferBytes, 4 * kMiB);
  EXPECT_EQ(kNcclLl128BufferBytes, 4'915'200);
  EXPECT_EQ(kNcclLlBufferBytes, 512 * 1024);
  EXPECT_EQ(NcclBufferBytes(1), 32 * 9'633'792);  // 294 MiB
  EXPECT_EQ(NcclBufferBytes(4), 4 * NcclBufferBytes(1));
  EXPECT_EQ(NcclBufferBytes(0), 0);
  // b x h x s^2 x 2 bytes: the 125M at micro-batch 16, the 2.7B at tp 2 (16 heads a rank).
  EXPECT_EQ(CudnnAttentionWorkspaceBytes(16, 12, 2048), 3 * kGiB / 2);
  EXPECT_EQ(CudnnAttentionWorkspaceBytes(4, 16, 2048), 512 * kMiB);
  EXPECT_EQ(ops::kGpuGemmWorkspaceBytes, 32 * kMiB);
}

TEST(GpuRuntimeMemoryTest, CommunicatorsOfMoreThanOneRank) {
  EXPECT_EQ(NcclCommunicatorCount(1, 1, 1, 0), 0);   // one GPU: no NCCL at all
  EXPECT_EQ(NcclCommunicatorCount(2, 1, 32, 0), 2);  // tp and dp
  EXPECT_EQ(NcclCommunicatorCount(1, 1, 8, 0), 1);
  // pp 4: the first and last stages also hold the embedding group; the middle ones do not.
  EXPECT_EQ(NcclCommunicatorCount(2, 4, 2, 0), 4);
  EXPECT_EQ(NcclCommunicatorCount(2, 4, 2, 1), 3);
  EXPECT_EQ(NcclCommunicatorCount(2, 4, 2, 3), 4);
  EXPECT_EQ(NcclCommunicatorCount(1, 2, 1, 1), 2);
}

TEST(GpuRuntimeMemoryTest, The125mAtMicroBatch16CountsItsAttentionWorkspace) {
  const std::vector<PipelineRankMemory> one = Estimate(Config125m(TrainOptions::CUDA), 1);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].gemm_workspace_bytes, 32 * kMiB);
  EXPECT_EQ(one[0].nccl_buffer_bytes, 0);  // one rank
  EXPECT_EQ(one[0].attention_workspace_bytes, 3 * kGiB / 2);
  EXPECT_EQ(one[0].runtime_bytes(), 32 * kMiB + 3 * kGiB / 2);
  EXPECT_EQ(one[0].device_bytes(), ModelShare(one[0]) + one[0].runtime_bytes());
  // Data parallel over 8 GPUs: one NCCL communicator (dp).
  const std::vector<PipelineRankMemory> eight = Estimate(Config125m(TrainOptions::CUDA), 8);
  ASSERT_EQ(eight.size(), 1u);
  EXPECT_EQ(eight[0].nccl_buffer_bytes, NcclBufferBytes(1));
  EXPECT_EQ(eight[0].runtime_bytes(), 32 * kMiB + NcclBufferBytes(1) + 3 * kGiB / 2);
}

TEST(GpuRuntimeMemoryTest, The27bAtTp2CountsTwoCommunicatorsAndHalfTheHeads) {
  const std::vector<PipelineRankMemory> ranks = Estimate(Config27b(TrainOptions::CUDA), 64);
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0].attention_workspace_bytes, 512 * kMiB);
  EXPECT_EQ(ranks[0].nccl_buffer_bytes, NcclBufferBytes(2));  // tp and dp
  EXPECT_EQ(ranks[0].device_bytes(),
            ModelShare(ranks[0]) + 32 * kMiB + NcclBufferBytes(2) + 512 * kMiB);
}

TEST(GpuRuntimeMemoryTest, OnlyWhereTheyApply) {
  // The CPU backend has none of them.
  for (const PipelineRankMemory& r : Estimate(Config125m(TrainOptions::CPU), 8)) {
    EXPECT_EQ(r.runtime_bytes(), 0);
    EXPECT_EQ(r.device_bytes(), ModelShare(r));
  }
  // fp32 storage, or a head_dim cuDNN's fused attention does not take, runs the own attention
  // kernel: no dP workspace, the rest stays.
  TrainConfig fp32 = Config125m(TrainOptions::CUDA);
  fp32.mutable_train()->set_precision(TrainOptions::FP32);
  EXPECT_FALSE(CudnnAttentionCounts(fp32));
  const std::vector<PipelineRankMemory> own = Estimate(fp32, 8);
  ASSERT_EQ(own.size(), 1u);
  EXPECT_EQ(own[0].attention_workspace_bytes, 0);
  EXPECT_EQ(own[0].runtime_bytes(), 32 * kMiB + NcclBufferBytes(1));
  TrainConfig wide_heads = Config125m(TrainOptions::CUDA);
  wide_heads.mutable_model()->set_num_heads(3);  // head_dim 256
  EXPECT_FALSE(CudnnAttentionCounts(wide_heads));
  TrainConfig odd_heads = Config125m(TrainOptions::CUDA);
  odd_heads.mutable_model()->set_num_heads(64);  // head_dim 12
  EXPECT_FALSE(CudnnAttentionCounts(odd_heads));
  TrainConfig bf16 = Config125m(TrainOptions::CUDA);
  bf16.mutable_train()->set_precision(TrainOptions::BF16);
  EXPECT_TRUE(CudnnAttentionCounts(bf16));
}

TEST(GpuRuntimeMemoryTest, DryRunAndTheCheckNameTheParts) {
  const std::vector<PipelineRankMemory> ranks = Estimate(Config27b(TrainOptions::CUDA), 64);
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(RuntimeParts(ranks[0]),
            "cuBLASLt workspace 0.03 GiB, NCCL buffers 0.57 GiB, cuDNN attention backward "
            "workspace 0.50 GiB");
  std::ostringstream out;
  NF_ASSERT_OK(DryRun(Config27b(TrainOptions::CUDA), 64, out));
  EXPECT_THAT(out.str(), HasSubstr("pipeline rank 0's GPU total includes the runtime's 1.11 GiB: "
                                   "cuBLASLt workspace 0.03 GiB, NCCL buffers 0.57 GiB, cuDNN "
                                   "attention backward workspace 0.50 GiB"));
}

}  // namespace
}  // namespace nf::launcher
