// nf-plan's search and step-time model (launcher/plan.h) on a small model and cluster.
#include "launcher/plan.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/config.h"
#include "launcher/memory_estimate.h"
#include "test_util.h"

namespace nf::launcher {
namespace {

using ::testing::HasSubstr;

TrainConfig SmallConfig() {
  TrainConfig config;
  model::ModelConfig& m = *config.mutable_model();
  m.set_num_layers(8);
  m.set_d_model(256);
  m.set_num_heads(8);
  m.set_ffn_dim(1024);
  m.set_vocab_size(1000);
  m.set_max_seq_len(256);
  TrainOptions& t = *config.mutable_train();
  t.set_seq_len(256);
  t.set_micro_batch_size(4);
  t.set_global_batch_size(64);
  t.set_precision(TrainOptions::BF16);
  t.mutable_lr_schedule()->set_warmup_iters(10);
  return config;
}

ClusterSpec SmallCluster() {
  ClusterSpec cluster;
  cluster.gpus_per_node = 4;
  cluster.nodes = 2;
  cluster.gpu_memory_bytes = 0.25e9;
  return cluster;
}

// Every layout listed fits, is what its --set flags give, and they come fastest first.
TEST(PlanLayoutsTest, ListsLayoutsThatFitFastestFirstWithTheirFlags) {
  const TrainConfig base = SmallConfig();
  const ClusterSpec cluster = SmallCluster();
  auto layouts = PlanLayouts(base, cluster);
  NF_ASSERT_OK(layouts);
  ASSERT_GT(layouts->size(), 20u);
  bool sequence_parallel = false, zero = false, interleaved = false, too_big_left_out = false;
  for (size_t k = 0; k < layouts->size(); ++k) {
    const PlannedLayout& l = (*layouts)[k];
    if (k > 0) {
      EXPECT_GE(l.time.total(), (*layouts)[k - 1].time.total());
    }
    EXPECT_LE(l.peak_device_bytes, cluster.gpu_memory_bytes * cluster.memory_headroom);
    TrainConfig from_flags = base;
    for (const std::string& o : l.overrides) NF_ASSERT_OK(ApplyOverride(o, &from_flags)) << o;
    NF_ASSERT_OK(ValidateTrainConfig(from_flags));
    auto memory = EstimateMemory(from_flags, cluster.world_size());
    NF_ASSERT_OK(memory);
    double peak = 0;
    for (const PipelineRankMemory& rank : *memory) peak = std::max(peak, rank.device_bytes());
    EXPECT_EQ(peak, l.peak_device_bytes);
    EXPECT_GT(l.mfu, 0);
    EXPECT_LT(l.mfu, cluster.gemm_efficiency);
    sequence_parallel |= l.config.parallel().sequence_parallel();
    zero |= l.config.parallel().distributed_optimizer();
    interleaved |= l.config.parallel().virtual_stages() > 1;
  }
  EXPECT_TRUE(sequence_parallel);
  EXPECT_TRUE(zero);
  EXPECT_TRUE(interleaved);
  // The single-GPU-sized layout (tp = pp = 1, no recompute, micro-batch 16) needs more than the
  // 0.25 GB: it is not listed.
  for (const PlannedLayout& l : *layouts) {
    const auto& p = l.config.parallel();
    too_big_left_out |= p.tensor_parallel() == 1 && p.pipeline_parallel() == 1 &&
                        l.config.train().micro_batch_size() == 16 &&
                        l.config.train().recompute() == TrainOptions::NONE &&
                        !p.distributed_optimizer();
  }
  EXPECT_FALSE(too_big_left_out);
}

TEST(PlanLayoutsTest, RefusesAnInvalidBaseConfig) {
  TrainConfig config = SmallConfig();
  config.mutable_train()->set_seq_len(512);  // beyond model.max_seq_len
  auto layouts = PlanLayouts(config, SmallCluster());
  ASSERT_EQ(layouts.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layouts.status().message(), HasSubstr("train.seq_len (512) exceeds"));
}

TEST(PlanLayoutsTest, NothingFitsNamesTheSmallestNeed) {
  ClusterSpec cluster = SmallCluster();
  cluster.gpu_memory_bytes = 1e6;
  auto layouts = PlanLayouts(SmallConfig(), cluster);
  ASSERT_EQ(layouts.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(layouts.status().message(), HasSubstr("no layout of this model fits 8 GPUs of 0 GB"));
  EXPECT_THAT(layouts.status().message(), HasSubstr("the smallest needs"));
}

TrainConfig With(const std::vector<std::string>& overrides) {
  TrainConfig config = SmallConfig();
  for (const std::string& o : overrides) EXPECT_TRUE(ApplyOverride(o, &config).ok()) << o;
  return config;
}

// The parts of the step-time model behave as launcher/plan.h states.
TEST(ModelStepTimeTest, PartsFollowTheStatedModel) {
  const ClusterSpec cluster = SmallCluster();
  auto none = ModelStepTime(With({"parallel.tensor_parallel=2"}), cluster);
  auto full = ModelStepTime(With({"parallel.tensor_parallel=2", "train.recompute=FULL"}), cluster);
  NF_ASSERT_OK(none);
  NF_ASSERT_OK(full);
  // Full recompute: a third more compute, the forward's collectives twice.
  EXPECT_NEAR(full->compute, none->compute * 4 / 3, 1e-12 * none->compute);
  EXPECT_GT(full->tp, none->tp);
  // No tensor parallelism, no tp communication; one data-parallel group of 8 over two nodes.
  auto dp_only = ModelStepTime(SmallConfig(), cluster);
  NF_ASSERT_OK(dp_only);
  EXPECT_EQ(dp_only->tp, 0.0);
  EXPECT_EQ(dp_only->bubble, 0.0);
  // Its gradient all-reduce is shown whole: what the backward hides and what it leaves exposed.
  EXPECT_GT(dp_only->dp_hidden, 0.0);
  EXPECT_GE(dp_only->dp, 0.0);
  // ZeRO-1's all-gather comes after the update: exposed whatever the backward hides.
  auto zero = ModelStepTime(With({"parallel.distributed_optimizer=true"}), cluster);
  NF_ASSERT_OK(zero);
  EXPECT_GT(zero->dp, 0.0);
  EXPECT_GT(zero->dp_hidden, 0.0);
  // A pipeline of 4 leaves dp = 2 and m = 64 / (2 x 4) = 8 micro-batches per data-parallel
  // rank: bubble = compute (p - 1) / (v m); interleaving over 2 virtual stages halves it.
  auto pipe = ModelStepTime(With({"parallel.pipeline_parallel=4"}), cluster);
  auto interleaved = ModelStepTime(
      With({"parallel.pipeline_parallel=4", "parallel.pipeline_schedule=INTERLEAVED_ONE_F_ONE_B",
            "parallel.virtual_stages=2"}),
      cluster);
  NF_ASSERT_OK(pipe);
  NF_ASSERT_OK(interleaved);
  const int m = 64 / (2 * 4);
  EXPECT_NEAR(pipe->bubble, pipe->compute * 3 / m, 1e-12);
  EXPECT_NEAR(interleaved->bubble, pipe->bubble / 2, 1e-12);
  EXPECT_GT(pipe->pp, 0.0);
}

}  // namespace
}  // namespace nf::launcher
