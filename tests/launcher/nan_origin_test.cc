// Where a NaN began (launcher/nan_origin.h) in real runs of one process: a NaN injected into a
// layer's fc1 weight (NF_INJECT_NAN) is named at that layer's fc1 GEMM in the forward of
// micro-batch 0, the weight is restored after the step, and a run stops naming it (message,
// console, log.jsonl); an fp16 loss scale far too high is named in the backward, at the loss's
// gradient; a healthy step writes no non-finite value anywhere (no false finding); the causal
// order and the agreement over the world. The 4-rank case (tp 2 x pp 2) is nan_origin_mpi.sh.
#include "launcher/nan_origin.h"

#include <cstdlib>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "launcher/config.h"
#include "launcher/train_loop.h"
#include "launcher/trainer.h"
#include "parallel/local_communicator.h"
#include "test_util.h"
#include "tests/cli_util.h"
#include "tests/training_test_util.h"

namespace nf::launcher {
namespace {

using ::nf::testing::Lines;
using ::nf::testing::MakeTrainer;
using ::nf::testing::ReadFile;
using ::nf::testing::TempDir;
using ::testing::HasSubstr;

// The trainer tests' two-layer model (training_test_util.h) for 4 steps, the search on.
TrainConfig Tiny(TrainOptions::Precision precision = TrainOptions::FP32) {
  TrainConfig config = nf::testing::TwoLayerTrainConfig(4);
  config.mutable_train()->mutable_lr_schedule()->set_warmup_iters(1);
  config.mutable_train()->set_precision(precision);
  config.mutable_train()->set_nan_origin(true);
  NF_EXPECT_OK(ValidateTrainConfig(config));
  return config;
}

// NF_INJECT_NAN=`value` while in scope.
class InjectedNan {
 public:
  explicit InjectedNan(const std::string& value) { setenv("NF_INJECT_NAN", value.c_str(), 1); }
  ~InjectedNan() { unsetenv("NF_INJECT_NAN"); }
};

TEST(NanOriginTest, AnInjectedNanIsNamedAtItsLayersFc1Gemm) {
  const InjectedNan nan("2:1:0");
  auto trainer = MakeTrainer(Tiny());
  absl::StatusOr<StepStats> stats = trainer->TrainStep();
  NF_ASSERT_OK(stats);
  EXPECT_FALSE(stats->skipped);
  EXPECT_FALSE(stats->nan_origin.has_value());  // only a step with non-finite gradients

  stats = trainer->TrainStep();
  NF_ASSERT_OK(stats);
  EXPECT_EQ(stats->skip_reason, optim::SkipReason::kNonFiniteGradients);
  ASSERT_TRUE(stats->nan_origin.has_value());
  ASSERT_TRUE(stats->nan_origin->first.has_value());
  const NanOrigin& origin = *stats->nan_origin->first;
  EXPECT_EQ(origin.world_rank, 0);
  EXPECT_EQ(origin.micro_batch, 0);
  EXPECT_FALSE(origin.backward);
  EXPECT_EQ(origin.stage, 0);
  EXPECT_EQ(origin.output.where, "layer 1 / fc1");
  EXPECT_EQ(origin.output.op, "Gemm");
  EXPECT_EQ(origin.output.output, "C");
  EXPECT_EQ(ops::NonFiniteName(origin.output.value), "nan");
  EXPECT_THAT(DescribeNanOrigin(origin),
              HasSubstr("micro-batch 0, forward of stage 0: layer 1 / fc1: Gemm wrote nan into C "
                        "(f32[64, 64] on cpu, element 0)"));

  // The weight holds its value again: the next step trains.
  stats = trainer->TrainStep();
  NF_ASSERT_OK(stats);
  EXPECT_FALSE(stats->skipped);
}

TEST(NanOriginTest, TheRunStopsNamingWhereTheNanBegan) {
  const InjectedNan nan("3:0:0");
  const TempDir run("nan_origin");
  std::ostringstream console;
  const absl::StatusOr<RunEnd> end = RunTraining(Tiny(), run.path().string(), console);
  ASSERT_EQ(end.status().code(), absl::StatusCode::kFailedPrecondition) << end.status();
  EXPECT_THAT(end.status().message(),
              HasSubstr("non-finite gradients at step 3 (FP32): stopping (the first non-finite "
                        "value: rank 0, micro-batch 0, forward of stage 0: layer 0 / fc1: Gemm "
                        "wrote nan into C"));
  EXPECT_THAT(end.status().message(), HasSubstr("); the last good checkpoint is "));
  EXPECT_THAT(console.str(), HasSubstr("non-finite gradients at step 3: the first non-finite "
                                       "value: rank 0, micro-batch 0"));
  int events = 0;
  for (const std::string& line : Lines(ReadFile(run.path() / "log.jsonl"))) {
    if (line.find(R"("event":"nan_origin")") == std::string::npos) continue;
    ++events;
    EXPECT_THAT(line, HasSubstr(R"("step":3,"found":true,"rank":0)"));
    EXPECT_THAT(line,
                HasSubstr(R"("pass":"forward","stage":0,"where":"layer 0 / fc1","op":"Gemm")"));
    EXPECT_THAT(line, HasSubstr(R"("value":"nan")"));
  }
  EXPECT_EQ(events, 1);
}

TEST(NanOriginTest, AnFp16LossScaleFarTooHighOverflowsInTheLossGradient) {
  TrainConfig config = Tiny(TrainOptions::FP16);
  // The loss's gradient is scale / tokens = 1e9 / 128 per token: past fp16's 65504.
  config.mutable_train()->mutable_loss_scale()->set_initial_scale(1e9f);
  auto trainer = MakeTrainer(config);
  const absl::StatusOr<StepStats> stats = trainer->TrainStep();
  NF_ASSERT_OK(stats);
  EXPECT_EQ(stats->skip_reason, optim::SkipReason::kNonFiniteGradients);
  ASSERT_TRUE(stats->nan_origin.has_value());
  ASSERT_TRUE(stats->nan_origin->first.has_value());
  EXPECT_TRUE(stats->nan_origin->first->backward);
  EXPECT_EQ(stats->nan_origin->first->micro_batch, 0);
  EXPECT_EQ(stats->nan_origin->first->output.where, "loss");
  EXPECT_EQ(stats->nan_origin->first->output.op, "CrossEntropyBackward");
  EXPECT_EQ(ops::NonFiniteName(stats->nan_origin->first->output.value), "inf");
}

// Every op of healthy steps, searched as the re-run searches them: none writes a NaN or an
// infinity, so a finding is never an artefact (masks, padding or scratch holding infinities).
TEST(NanOriginTest, AHealthyStepWritesNoNonFiniteValue) {
  for (const TrainOptions::Precision precision :
       {TrainOptions::FP32, TrainOptions::BF16, TrainOptions::FP16}) {
    for (const TrainOptions::Recompute recompute :
         {TrainOptions::NONE, TrainOptions::SELECTIVE, TrainOptions::FULL}) {
      SCOPED_TRACE(absl::StrCat(TrainOptions::Precision_Name(precision), " ",
                                TrainOptions::Recompute_Name(recompute)));
      TrainConfig config = Tiny(precision);
      config.mutable_train()->set_recompute(recompute);
      config.mutable_model()->set_dropout(0.1f);
      auto trainer = MakeTrainer(config);
      ops::NonFiniteTrace trace;
      trace.BeginPass();
      for (int step = 0; step < 2; ++step) {
        const absl::StatusOr<StepStats> stats = trainer->TrainStep();
        NF_ASSERT_OK(stats);
        EXPECT_FALSE(stats->skipped);
      }
      EXPECT_FALSE(trace.first().has_value())
          << trace.first()->where << ": " << trace.first()->op << " " << trace.first()->output;
      NF_EXPECT_OK(trace.status());
    }
  }
}

NanOrigin At(int64_t micro_batch, bool backward, int stage, int64_t op_index, int rank) {
  NanOrigin origin;
  origin.world_rank = rank;
  origin.micro_batch = micro_batch;
  origin.backward = backward;
  origin.stage = stage;
  origin.output.op_index = op_index;
  return origin;
}

TEST(NanOriginTest, TheFirstInCausalOrder) {
  constexpr int kStages = 4;
  // The lower micro-batch first, whatever else.
  EXPECT_TRUE(CausallyBefore(At(0, true, 0, 9, 7), At(1, false, 0, 0, 0), kStages));
  // Its forward before its backward.
  EXPECT_TRUE(CausallyBefore(At(0, false, 3, 9, 7), At(0, true, 3, 0, 0), kStages));
  // The forward's stages in order, the backward's in reverse.
  EXPECT_TRUE(CausallyBefore(At(0, false, 1, 9, 7), At(0, false, 2, 0, 0), kStages));
  EXPECT_TRUE(CausallyBefore(At(0, true, 2, 9, 7), At(0, true, 1, 0, 0), kStages));
  // Then the op's place in its pass, then the rank.
  EXPECT_TRUE(CausallyBefore(At(0, false, 1, 3, 7), At(0, false, 1, 4, 0), kStages));
  EXPECT_TRUE(CausallyBefore(At(0, false, 1, 3, 0), At(0, false, 1, 3, 1), kStages));
  EXPECT_FALSE(CausallyBefore(At(0, false, 1, 3, 1), At(0, false, 1, 3, 1), kStages));
}

TEST(NanOriginTest, AFindingTravelsTheAgreementWhole) {
  parallel::LocalCommunicator world;
  absl::StatusOr<NanOriginAgreement> agreed = AgreeOnNanOrigin(std::nullopt, 1, world);
  NF_ASSERT_OK(agreed);
  EXPECT_FALSE(agreed->first.has_value());
  EXPECT_EQ(agreed->ranks_found, 0);

  NanOrigin mine = At(5, true, 0, 17, 0);
  mine.rank_label = "rank 0 (tp=0, dp=0, pp=0)";
  mine.output.op = "LayerNormBackward";
  mine.output.where = "layer 3 / post_attn_norm, residual, ffn_norm";
  mine.output.output = "dweight";
  mine.output.tensor = "f32[32] on cpu";
  mine.output.element = 31;
  mine.output.value = -std::numeric_limits<double>::infinity();
  agreed = AgreeOnNanOrigin(mine, 1, world);
  NF_ASSERT_OK(agreed);
  ASSERT_TRUE(agreed->first.has_value());
  EXPECT_EQ(agreed->ranks_found, 1);
  EXPECT_EQ(DescribeNanOrigin(*agreed->first), DescribeNanOrigin(mine));
  EXPECT_EQ(agreed->first->output.op_index, 17);
  EXPECT_EQ(
      DescribeNanOrigin(mine),
      "rank 0 (tp=0, dp=0, pp=0), micro-batch 5, backward of stage 0: layer 3 / "
      "post_attn_norm, residual, ffn_norm: LayerNormBackward wrote -inf into dweight (f32[32] "
      "on cpu, element 31)");
}

}  // namespace
}  // namespace nf::launcher
