// nf-plan's search and step-time model (launcher/plan.h) on a small model and cluster.
#include "launcher/plan.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/config.h"
#include "launcher/memory_estimate.h"
#include "launcher/plan_compute.h"
#include "launcher/plan_options.h"
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
  // 0.25 GB for the model's share, and room for the CUDA runtime's own (the cuBLASLt workspace,
  // NCCL's buffers of up to four communicators, cuDNN attention's backward workspace).
  cluster.gpu_memory_bytes = 0.25e9 + 1.4e9;
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
    from_flags.mutable_train()->set_device(TrainOptions::CUDA);  // what nf-plan estimates
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

// The cluster's figures are checked where they are used, not only on nf-plan's command line: an
// infinite peak or an efficiency of 5 made every time 0 or meaningless, and a world of 2^30+
// GPUs overflowed. Each refusal names the flag that sets the figure.
TEST(PlanLayoutsTest, RefusesClusterFiguresOutOfRange) {
  const struct {
    void (*spoil)(ClusterSpec&);
    const char* names;
  } cases[] = {
      {[](ClusterSpec& c) { c.peak_flops = std::numeric_limits<double>::infinity(); },
       "--peak-tflops: 'inf' is out of range: a number in (0, 100000] TFLOP/s"},
      {[](ClusterSpec& c) { c.gemm_efficiency = 5; }, "--gemm-efficiency: '5'"},
      {[](ClusterSpec& c) { c.attention_efficiency = std::nan(""); }, "--attention-efficiency"},
      {[](ClusterSpec& c) { c.nvlink_bytes_per_second = -1; }, "--nvlink-gbps"},
      {[](ClusterSpec& c) { c.nodes = kMaxNodes + 1; }, "--nodes: '1048577'"},
      {[](ClusterSpec& c) { c.gpus_per_node = 0; }, "--gpus-per-node: '0'"},
      {[](ClusterSpec& c) { c.memory_headroom = 1.5; }, "memory_headroom"},
  };
  for (const auto& c : cases) {
    ClusterSpec cluster = SmallCluster();
    c.spoil(cluster);
    auto layouts = PlanLayouts(SmallConfig(), cluster);
    ASSERT_EQ(layouts.status().code(), absl::StatusCode::kInvalidArgument) << c.names;
    EXPECT_THAT(layouts.status().message(), HasSubstr(c.names));
    auto time = ModelStepTime(SmallConfig(), cluster);
    ASSERT_EQ(time.status().code(), absl::StatusCode::kInvalidArgument) << c.names;
  }
  // --cpu's "no memory bandwidth modelled" stays allowed.
  ClusterSpec cpu = SmallCluster();
  cpu.hbm_bytes_per_second = 0;
  NF_EXPECT_OK(ValidateCluster(cpu));
}

// 4 x 2^20 GPUs for a batch of 64: no layout splits it; the refusal says so and how many GPUs
// the batch can keep busy (64 x tp 4 x pp 8), instead of "the smallest needs inf GB".
TEST(PlanLayoutsTest, AWorldTooLargeForTheBatchSaysWhyNothingSplits) {
  ClusterSpec cluster = SmallCluster();
  cluster.nodes = kMaxNodes;
  auto layouts = PlanLayouts(SmallConfig(), cluster);
  ASSERT_EQ(layouts.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(layouts.status().message(),
              HasSubstr("splits train.global_batch_size (64) over 4194304 GPUs"));
  EXPECT_THAT(layouts.status().message(), HasSubstr("at most 2048 GPUs busy"));
  EXPECT_THAT(layouts.status().message(), ::testing::Not(HasSubstr("inf")));
}

// A batch beyond the search's limit is refused; one whose every split runs too many micro-batch
// passes a step says so.
TEST(PlanLayoutsTest, BatchLimits) {
  TrainConfig config = SmallConfig();
  config.mutable_train()->set_global_batch_size(kMaxGlobalBatch * 2);
  auto layouts = PlanLayouts(config, SmallCluster());
  ASSERT_EQ(layouts.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layouts.status().message(), HasSubstr("at most 1048576 sequences"));
  // 2^20 sequences on one GPU: 65536 micro-batches of 16 a step, within the limit; the smaller
  // micro-batches are not.
  config.mutable_train()->set_global_batch_size(kMaxGlobalBatch);
  ClusterSpec one = SmallCluster();
  one.gpus_per_node = 1;
  one.nodes = 1;
  one.gpu_memory_bytes = 100e9;
  layouts = PlanLayouts(config, one);
  NF_ASSERT_OK(layouts);
  for (const PlannedLayout& l : *layouts) EXPECT_EQ(l.config.train().micro_batch_size(), 16);
  // An odd batch splits only into micro-batches of 1: 999999 passes a step on one GPU.
  config.mutable_train()->set_global_batch_size(999999);
  config.mutable_train()->set_micro_batch_size(1);
  layouts = PlanLayouts(config, one);
  ASSERT_EQ(layouts.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(layouts.status().message(), HasSubstr("more than 65536 micro-batch passes"));
}

// The figures given override the --gpu preset whichever comes first.
TEST(PlanOptionsTest, FiguresOverrideThePresetWhateverTheirOrder) {
  const char* argv[] = {"nf-plan", "--gemm-efficiency", "0.7", "--config", "x.pbtxt", "--gpu",
                        "a100",    "--nodes",           "3"};
  auto options = ParsePlanOptions(std::size(argv), argv);
  NF_ASSERT_OK(options);
  EXPECT_EQ(options->cluster.gemm_efficiency, 0.7);
  EXPECT_EQ(options->cluster.peak_flops, 312e12);
  EXPECT_EQ(options->cluster.nodes, 3);
  EXPECT_EQ(options->config_path, "x.pbtxt");
  NF_EXPECT_OK(ValidateCluster(options->cluster));
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
  // Full recompute: every layer's forward once more (4 micro-batches of 8 layers: dp 4 of a
  // global batch of 64 in micro-batches of 4), the forward's collectives twice.
  const MicroBatchWork work = EstimateMicroBatchWork(With({"parallel.tensor_parallel=2"}), cluster);
  EXPECT_NEAR(full->compute - none->compute, 4 * 8 * work.layer_forward, 1e-9 * none->compute);
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

// The GEMM rate follows the product's shape: large ones at the peak x gemm_efficiency, one
// wave of tiles too many at about half that, a thin one at the memory bandwidth.
TEST(PlanComputeTest, GemmTimeFollowsItsShape) {
  ClusterSpec h100;
  NF_ASSERT_OK(ApplyGpuPreset("h100", h100));
  const double rate = h100.peak_flops * h100.gemm_efficiency;
  // 8448 x 4096 output: 66 x 16 = 1056 tiles of 128 x 256, exactly 8 waves of 132 SMs.
  EXPECT_NEAR(GemmSeconds(8448, 4096, 4096, 1, 2, h100), 2.0 * 8448 * 4096 * 4096 / rate, 1e-9);
  // One more row of tiles: 1072 tiles take 9 waves, the last one 8 tiles.
  const double over = GemmSeconds(8448 + 128, 4096, 4096, 1, 2, h100);
  EXPECT_NEAR(over, 2.0 * (8448 + 128) * 4096 * 4096 / (rate * 1072 / (9 * 132.0)), 1e-9);
  // k = 8: 16 FLOPs per element of C, far below the 300 FLOPs a byte the peak needs.
  const double thin = GemmSeconds(8192, 8192, 8, 1, 2, h100);
  EXPECT_NEAR(
      thin,
      2.0 * (8192.0 * 8 * 2 + 8192.0 * 8192) / (h100.hbm_bytes_per_second * h100.memory_efficiency),
      1e-12);
}

TEST(PlanComputeTest, MemoryBoundWorkAndAttentionAsStated) {
  TrainConfig config = SmallConfig();
  ClusterSpec cluster;
  NF_ASSERT_OK(ApplyGpuPreset("a100", cluster));
  const MicroBatchWork blockwise = EstimateMicroBatchWork(config, cluster);
  cluster.materialized_attention = true;
  const MicroBatchWork materialized = EstimateMicroBatchWork(config, cluster);
  // The S x S scores in memory cost more than the blockwise kernels' FLOPs at this shape.
  EXPECT_GT(materialized.attention_forward, blockwise.attention_forward);
  EXPECT_GT(materialized.layer_backward, blockwise.layer_backward);
  // Without a memory bandwidth (--cpu) only the products count.
  cluster.materialized_attention = false;
  cluster.hbm_bytes_per_second = 0;
  const MicroBatchWork products = EstimateMicroBatchWork(config, cluster);
  EXPECT_LT(products.layer_forward, blockwise.layer_forward);
  EXPECT_EQ(OptimizerSeconds(1e9, 2, cluster), 0.0);
  // NormFormer's two extra LayerNorms are memory-bound work a plain Pre-LN layer lacks.
  cluster.hbm_bytes_per_second = 2.04e12;
  config.mutable_model()->mutable_normformer()->set_scale_attn(false);
  config.mutable_model()->mutable_normformer()->set_scale_fc(false);
  EXPECT_LT(EstimateMicroBatchWork(config, cluster).layer_forward, blockwise.layer_forward);
}

TEST(PlanComputeTest, GpuPresets) {
  ClusterSpec cluster;
  cluster.nodes = 3;
  NF_ASSERT_OK(ApplyGpuPreset("a100", cluster));
  EXPECT_EQ(cluster.peak_flops, 312e12);
  EXPECT_EQ(cluster.sm_count, 108);
  EXPECT_EQ(cluster.nodes, 3);  // the cluster's size is kept
  const absl::Status unknown = ApplyGpuPreset("v100", cluster);
  EXPECT_THAT(unknown.message(), HasSubstr("'v100' is not h200, h100 or a100"));
}

// Megatron-LM of 2021 ran every collective in line (--overlap none): the four tensor-parallel
// all-reduces of a layer's forward and backward all count, each at the NVLink bandwidth NCCL
// reaches (0.8 of the line rate), and the gradient reduction comes after the whole backward.
TEST(ModelStepTimeTest, WithoutOverlapEveryCollectiveCounts) {
  ClusterSpec cluster = SmallCluster();
  const TrainConfig config = With({"parallel.tensor_parallel=2"});
  auto overlapped = ModelStepTime(config, cluster);
  cluster.overlap_communication = false;
  auto in_line = ModelStepTime(config, cluster);
  NF_ASSERT_OK(overlapped);
  NF_ASSERT_OK(in_line);
  // tp 2 x dp 4 on nodes of 4: 64 / (4 x 4) = 4 micro-batches of 4 x 256 tokens, 8 layers; an
  // all-reduce of [1024, 256] bf16 moves 2 x 1/2 of its bytes.
  const double bytes = 4 * 256 * 256 * 2.0;
  const double all_reduce = cluster.collective_latency_seconds +
                            bytes / (cluster.nvlink_bytes_per_second * cluster.nvlink_efficiency);
  EXPECT_NEAR(in_line->tp, 4 * 8 * 4 * all_reduce, 1e-12);
  EXPECT_LT(overlapped->tp, in_line->tp);
  EXPECT_EQ(in_line->dp_hidden, 0.0);
  EXPECT_NEAR(in_line->dp, overlapped->dp + overlapped->dp_hidden, 1e-12);
  EXPECT_EQ(in_line->compute, overlapped->compute);
}

// A pipeline runs at its slowest stage's pace: the last, with its layers and the whole LM head.
TEST(ModelStepTimeTest, ThePipelineRunsAtTheLastStagesPace) {
  const ClusterSpec cluster = SmallCluster();
  const TrainConfig config = With({"parallel.pipeline_parallel=4"});
  auto time = ModelStepTime(config, cluster);
  NF_ASSERT_OK(time);
  const MicroBatchWork work = EstimateMicroBatchWork(config, cluster);
  // dp 2: 8 micro-batches of 2 layers each and the head.
  EXPECT_NEAR(
      time->compute,
      8 * (2 * (work.layer_forward + work.layer_backward) + work.head_forward + work.head_backward),
      1e-12);
}

// ZeRO-1's optimizer step covers the rank's 1 / dp of the parameters.
TEST(ModelStepTimeTest, TheOptimizerStepIsShardedByZero) {
  const ClusterSpec cluster = SmallCluster();
  auto plain = ModelStepTime(SmallConfig(), cluster);
  auto zero = ModelStepTime(With({"parallel.distributed_optimizer=true"}), cluster);
  NF_ASSERT_OK(plain);
  NF_ASSERT_OK(zero);
  EXPECT_GT(plain->optimizer, 0.0);
  EXPECT_NEAR(zero->optimizer, plain->optimizer / 8, 1e-12);
}

}  // namespace
}  // namespace nf::launcher
