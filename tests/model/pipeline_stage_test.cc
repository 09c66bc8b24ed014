// Pipeline stages of the NormFormer model against the whole model, in one process: the tiny
// model is cut into 2 or 3 stages with StageLayers, the stages are chained by hand (stage k's
// output hidden state is stage k + 1's input; the last stage's input gradient is the previous
// stage's output gradient), and the loss, every parameter's initial value and every gradient
// are compared with the one-stage model on the same batch, dropout on.
//
// Why exact equality holds: every stage runs the very ops of the whole model, in the same
// order, on the same values (the hidden states and gradients pass between stages as exact
// copies, parameters draw their initial values from their names, and layers keep their global
// dropout sites), and the CPU ops are deterministic. The one exception is the tied embedding:
// the whole model accumulates the head's gradient and the lookup gradients into one buffer,
// the stages into two that are summed afterwards, which reassociates fp32 additions.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/ops/ops.h"
#include "gtest/gtest.h"
#include "model/normformer_model.h"
#include "parallel/pipeline_schedule.h"
#include "test_util.h"

namespace nf::model {
namespace {

using ::nf::testing::MakeIds;

constexpr int64_t kBatch = 2, kSeq = 6;
constexpr uint32_t kSeed = 17;
constexpr uint64_t kFirstSample = 3;
constexpr float kLossWeight = 0.25f;
constexpr char kEmbedding[] = "decoder.embed_tokens.weight";

struct Split {
  std::string name;
  int num_layers, num_stages;
  bool tie;
  ModelConfig::Positions positions;
  bool scale_resids;
  bool recompute = false;
  ModelConfig::Objective objective = ModelConfig::CAUSAL_LM;
};

ModelConfig TinyConfig(const Split& s) {
  ModelConfig c;
  c.set_num_layers(s.num_layers);
  c.set_d_model(8);
  c.set_num_heads(2);
  c.set_ffn_dim(16);
  c.set_vocab_size(37);
  c.set_max_seq_len(8);
  c.set_positions(s.positions);
  c.set_dropout(0.1f);
  c.set_attention_dropout(0.1f);
  c.set_activation_dropout(0.1f);
  c.set_tie_embeddings(s.tie);
  c.set_objective(s.objective);
  NormFormerConfig* nf = c.mutable_normformer();
  nf->set_scale_attn(true);
  nf->set_scale_heads(true);
  nf->set_scale_fc(true);
  nf->set_scale_resids(s.scale_resids);
  return c;
}

ModelOptions Options(bool recompute, PipelineStagePlacement placement = {}) {
  return {.dtype = DType::kF32,
          .micro_batch = kBatch,
          .seq_len = kSeq,
          .recompute = recompute ? Recompute::kFull : Recompute::kNone,
          .seed = kSeed,
          .pipeline = placement};
}

struct Batch {
  Tensor inputs, targets;
};

Batch MakeBatch(int vocab) {
  std::mt19937 rng(5);
  std::vector<int32_t> inputs, targets;
  for (int64_t i = 0; i < kBatch * kSeq; ++i) {
    inputs.push_back(static_cast<int32_t>(rng() % vocab));
    targets.push_back(static_cast<int32_t>(rng() % vocab));
  }
  targets[4] = -1;  // one position without a loss
  return {MakeIds({kBatch, kSeq}, inputs), MakeIds({kBatch, kSeq}, targets)};
}

std::vector<std::unique_ptr<NormFormerModel>> MakeStages(const ModelConfig& config,
                                                         const Split& split) {
  std::vector<std::unique_ptr<NormFormerModel>> stages;
  const std::vector<std::pair<int, int>> ranges =
      parallel::StageLayers(config.num_layers(), split.num_stages);
  for (int s = 0; s < split.num_stages; ++s) {
    auto stage =
        NormFormerModel::Create(config, Options(split.recompute, {.stage = s,
                                                                  .num_stages = split.num_stages,
                                                                  .layer_begin = ranges[s].first,
                                                                  .layer_end = ranges[s].second}));
    NF_EXPECT_OK(stage);
    if (!stage.ok()) return {};
    stages.push_back(*std::move(stage));
  }
  return stages;
}

// Forward through the stages in order, then backward in reverse; returns the last stage's loss.
NormFormerModel::LossSum RunChained(std::vector<std::unique_ptr<NormFormerModel>>& stages,
                                    const Batch& batch) {
  const Tensor* hidden = nullptr;
  for (size_t s = 0; s < stages.size(); ++s) {
    auto out = stages[s]->ForwardStage(/*micro_batch=*/0, s == 0 ? &batch.inputs : nullptr, hidden,
                                       batch.targets, kFirstSample, /*train=*/true);
    NF_EXPECT_OK(out);
    if (!out.ok()) return {};
    hidden = *out;
  }
  const absl::StatusOr<NormFormerModel::LossSum> loss = stages.back()->TakeLossSum();
  NF_EXPECT_OK(loss);
  const Tensor* grad = nullptr;
  for (size_t s = stages.size(); s-- > 0;) {
    const absl::Status status = stages[s]->BackwardStage(/*micro_batch=*/0, grad, kLossWeight);
    NF_EXPECT_OK(status);
    grad = &stages[s]->input_grad();
  }
  return loss.value_or(NormFormerModel::LossSum{});
}

class PipelineStageTest : public ::testing::TestWithParam<Split> {};

INSTANTIATE_TEST_SUITE_P(
    Splits, PipelineStageTest,
    ::testing::Values(
        Split{"two_layers_two_stages_tied", 2, 2, true, ModelConfig::SINUSOIDAL, false},
        Split{"three_layers_three_stages_untied_learned", 3, 3, false, ModelConfig::LEARNED, true},
        Split{"four_layers_three_stages_tied_learned", 4, 3, true, ModelConfig::LEARNED, true},
        Split{"four_layers_two_stages_untied_recompute", 4, 2, false, ModelConfig::SINUSOIDAL,
              false, true},
        Split{"masked_lm_three_layers_three_stages_tied", 3, 3, true, ModelConfig::LEARNED, true,
              false, ModelConfig::MASKED_LM},
        Split{"masked_lm_four_layers_two_stages_untied_recompute", 4, 2, false,
              ModelConfig::LEARNED, false, true, ModelConfig::MASKED_LM}),
    [](const ::testing::TestParamInfo<Split>& info) { return info.param.name; });

TEST_P(PipelineStageTest, StagesHoldTheWholeModelsParametersWithItsInitialValues) {
  const ModelConfig config = TinyConfig(GetParam());
  auto whole = NormFormerModel::Create(config, Options(GetParam().recompute));
  NF_ASSERT_OK(whole);
  auto stages = MakeStages(config, GetParam());
  ASSERT_EQ(stages.size(), static_cast<size_t>(GetParam().num_stages));
  std::vector<std::string> held;
  for (const auto& stage : stages) {
    for (const ParamTable::Entry& e : stage->params().entries()) {
      SCOPED_TRACE(e.spec.name);
      ASSERT_TRUE((*whole)->params().Contains(e.spec.name));
      EXPECT_EQ(*ToFloatVector(e.value), *ToFloatVector((*whole)->params().Get(e.spec.name).value));
      held.push_back(e.spec.name);
    }
  }
  // Every parameter of the whole model lives on exactly one stage, except the tied embedding,
  // which the last stage holds again as its head.
  for (const ParamTable::Entry& e : (*whole)->params().entries()) {
    const int copies = e.spec.name == kEmbedding && config.tie_embeddings() ? 2 : 1;
    EXPECT_EQ(std::count(held.begin(), held.end(), e.spec.name), copies) << e.spec.name;
  }
  EXPECT_EQ(held.size(), (*whole)->params().entries().size() + (config.tie_embeddings() ? 1 : 0));
}

TEST_P(PipelineStageTest, ChainedStagesGiveTheWholeModelsLossAndGradients) {
  const ModelConfig config = TinyConfig(GetParam());
  const Batch batch = MakeBatch(config.vocab_size());
  auto whole = NormFormerModel::Create(config, Options(GetParam().recompute));
  NF_ASSERT_OK(whole);
  auto whole_loss = (*whole)->Forward(batch.inputs, batch.targets, kFirstSample, true);
  NF_ASSERT_OK(whole_loss);
  NF_ASSERT_OK((*whole)->Backward(kLossWeight));

  auto stages = MakeStages(config, GetParam());
  ASSERT_EQ(stages.size(), static_cast<size_t>(GetParam().num_stages));
  const NormFormerModel::LossSum loss = RunChained(stages, batch);
  // The same ops in the same order on the same values (see the top of the file): bit-identical.
  EXPECT_EQ(loss.sum, whole_loss->sum);
  EXPECT_EQ(loss.tokens, whole_loss->tokens);

  std::vector<float> embedding_sum;
  for (const auto& stage : stages) {
    for (const ParamTable::Entry& e : stage->params().entries()) {
      const std::vector<float> grad = *ToFloatVector(e.grad);
      if (e.spec.name == kEmbedding && config.tie_embeddings()) {
        // The first stage's lookup gradient and the last stage's head gradient.
        if (embedding_sum.empty()) embedding_sum.assign(grad.size(), 0.0f);
        for (size_t i = 0; i < grad.size(); ++i) embedding_sum[i] += grad[i];
        continue;
      }
      EXPECT_EQ(grad, *ToFloatVector((*whole)->params().Get(e.spec.name).grad)) << e.spec.name;
    }
  }
  if (!config.tie_embeddings()) return;
  const std::vector<float> expected = *ToFloatVector((*whole)->params().Get(kEmbedding).grad);
  ASSERT_EQ(embedding_sum.size(), expected.size());
  // The whole model adds a row's <= kBatch * kSeq = 12 lookup gradients onto its head gradient
  // one by one; the stages sum the lookups from zero and add the head gradient last. Both are
  // the same 13 terms summed in fp32 in different orders, each within a few roundings (2^-24
  // relative) of partial sums no larger than a small multiple of the parameter's largest
  // gradient: 8 u32 of that bounds the difference (measured: at most 1 ulp of the element).
  float largest = 0.0f;
  for (float g : expected) largest = std::max(largest, std::abs(g));
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_NEAR(embedding_sum[i], expected[i], 8 * 0x1p-24 * largest) << "element " << i;
  }
}

// The global gradient norm counts every parameter once: after the embedding group's all-reduce
// (simulated here by giving both tied copies the summed gradient), the stages' owned squared
// norms add up to the whole model's.
TEST_P(PipelineStageTest, OwnedGradientNormsSumToTheWholeModelsNorm) {
  const ModelConfig config = TinyConfig(GetParam());
  const Batch batch = MakeBatch(config.vocab_size());
  auto whole = NormFormerModel::Create(config, Options(GetParam().recompute));
  NF_ASSERT_OK(whole);
  NF_ASSERT_OK((*whole)->Forward(batch.inputs, batch.targets, kFirstSample, true));
  NF_ASSERT_OK((*whole)->Backward(kLossWeight));
  auto stages = MakeStages(config, GetParam());
  ASSERT_EQ(stages.size(), static_cast<size_t>(GetParam().num_stages));
  RunChained(stages, batch);
  if (config.tie_embeddings()) {
    const Tensor& first = stages.front()->params().Get(kEmbedding).grad;
    const Tensor& last = stages.back()->params().Get(kEmbedding).grad;
    Tensor sum = *Tensor::HostZeros(DType::kF32, first.shape());
    NF_ASSERT_OK(ops::Axpy(1.0f, first, sum));
    NF_ASSERT_OK(ops::Axpy(1.0f, last, sum));
    NF_ASSERT_OK(ops::Cast(sum, first));
    NF_ASSERT_OK(ops::Cast(sum, last));
  }
  double total = 0.0;
  for (const auto& stage : stages) total += *stage->OwnedSquaredGradNorm();
  const double expected = *(*whole)->OwnedSquaredGradNorm();
  // The same squares summed per stage instead of at once, and the tied embedding's gradient
  // summed in another order (within 8 u32 of its largest element, test above): 1e-5 relative.
  EXPECT_NEAR(total, expected, 1e-5 * expected);
  EXPECT_GT(expected, 0.0);
}

TEST_P(PipelineStageTest, OnlyTheEndStagesOfATiedModelJoinTheEmbeddingGroup) {
  const ModelConfig config = TinyConfig(GetParam());
  auto stages = MakeStages(config, GetParam());
  ASSERT_EQ(stages.size(), static_cast<size_t>(GetParam().num_stages));
  for (size_t s = 0; s < stages.size(); ++s) {
    const bool end_stage = s == 0 || s + 1 == stages.size();
    const std::vector<std::string> expected = config.tie_embeddings() && end_stage
                                                  ? std::vector<std::string>{kEmbedding}
                                                  : std::vector<std::string>{};
    EXPECT_EQ(stages[s]->embedding_group_params(), expected) << "stage " << s;
  }
}

// A step's forwards add their losses on the device; TakeLossSum reads the total once and
// starts the next step from zero. Micro-batches with different first samples draw different
// dropout masks, so the two losses differ and a sum that dropped one would show.
TEST_P(PipelineStageTest, TheLastStageTotalsItsForwardsLossesUntilTaken) {
  const ModelConfig config = TinyConfig(GetParam());
  const Batch batch = MakeBatch(config.vocab_size());
  auto whole = NormFormerModel::Create(config, Options(GetParam().recompute));
  NF_ASSERT_OK(whole);
  NormFormerModel& model = **whole;
  auto first = model.Forward(batch.inputs, batch.targets, kFirstSample, true);
  auto second = model.Forward(batch.inputs, batch.targets, kFirstSample + kBatch, true);
  NF_ASSERT_OK(first);
  NF_ASSERT_OK(second);
  ASSERT_NE(first->sum, second->sum);
  for (int mb = 0; mb < 2; ++mb) {
    NF_ASSERT_OK(model.ForwardStage(mb, &batch.inputs, nullptr, batch.targets,
                                    kFirstSample + mb * kBatch, true));
  }
  auto total = model.TakeLossSum();
  NF_ASSERT_OK(total);
  // Each forward adds its row-order double sum to the total: the same two additions.
  EXPECT_EQ(total->sum, first->sum + second->sum);
  EXPECT_EQ(total->tokens, first->tokens + second->tokens);
  auto taken = model.TakeLossSum();
  NF_ASSERT_OK(taken);
  EXPECT_EQ(taken->sum, 0.0);
  EXPECT_EQ(taken->tokens, 0);
}

TEST(PipelineStageRefusalTest, RefusesLayerRangesThatAreNotAStage) {
  const ModelConfig config = TinyConfig({"four", 4, 2, true, ModelConfig::SINUSOIDAL, false});
  const auto refusal = [&](PipelineStagePlacement placement) {
    auto model = NormFormerModel::Create(config, Options(false, placement));
    EXPECT_FALSE(model.ok());
    return model.ok() ? std::string() : std::string(model.status().message());
  };
  EXPECT_EQ(refusal({.stage = 0, .num_stages = 2, .layer_begin = 0, .layer_end = 0}),
            "pipeline stage 0 of 2: layer range [0, 0) must be a non-empty range within the "
            "model's layers [0, 4)");
  EXPECT_EQ(refusal({.stage = 1, .num_stages = 2, .layer_begin = 2, .layer_end = 5}),
            "pipeline stage 1 of 2: layer range [2, 5) must be a non-empty range within the "
            "model's layers [0, 4)");
  EXPECT_EQ(refusal({.stage = 1, .num_stages = 2, .layer_begin = -1, .layer_end = 4}),
            "pipeline stage 1 of 2: layer range [-1, 4) must be a non-empty range within the "
            "model's layers [0, 4)");
  EXPECT_EQ(refusal({.stage = 2, .num_stages = 2, .layer_begin = 2, .layer_end = 4}),
            "pipeline stage 2 of 2: the stage must be in [0, num_stages) and num_stages >= 1");
  EXPECT_EQ(refusal({.stage = 1, .num_stages = 2, .layer_begin = 0, .layer_end = 4}),
            "pipeline stage 1 of 2: layer range [0, 4) must start at layer 0 exactly when the "
            "stage is the first (it holds the embedding)");
  EXPECT_EQ(refusal({.stage = 0, .num_stages = 2, .layer_begin = 0, .layer_end = 4}),
            "pipeline stage 0 of 2: layer range [0, 4) must end at layer 4 exactly when the "
            "stage is the last (it holds the head and the loss)");
}

TEST(PipelineStageRefusalTest, AStageRefusesTheWholeModelCallsAndMissingInputs) {
  const Split split{"four", 4, 2, true, ModelConfig::SINUSOIDAL, false};
  const ModelConfig config = TinyConfig(split);
  const Batch batch = MakeBatch(config.vocab_size());
  auto stages = MakeStages(config, split);
  ASSERT_EQ(stages.size(), 2u);
  auto whole_call = stages[0]->Forward(batch.inputs, batch.targets, 0, true);
  ASSERT_FALSE(whole_call.ok());
  EXPECT_EQ(whole_call.status().message(),
            "NormFormerModel::Forward runs the whole model, but this is pipeline stage 0 of 2: "
            "use ForwardStage");
  auto no_hidden = stages[1]->ForwardStage(0, nullptr, nullptr, batch.targets, 0, true);
  ASSERT_FALSE(no_hidden.ok());
  EXPECT_EQ(no_hidden.status().message(),
            "NormFormerModel: pipeline stage 1 of 2 needs input_hidden (none) as f32[12, 8] "
            "(micro_batch * seq_len, d_model)");
  const absl::Status not_in_flight = stages[0]->BackwardStage(3, nullptr, 1.0f);
  EXPECT_EQ(not_in_flight.message(),
            "NormFormerModel::BackwardStage: micro-batch 3 is not in flight on pipeline stage 0 "
            "(no ForwardStage, or its backward already ran)");
  NF_ASSERT_OK(stages[0]->ForwardStage(3, &batch.inputs, nullptr, batch.targets, 0, true));
  const absl::Status no_grad = stages[0]->BackwardStage(3, nullptr, 1.0f);
  EXPECT_FALSE(no_grad.ok());
  EXPECT_NE(no_grad.message().find("needs output_grad (none)"), absl::string_view::npos) << no_grad;
}

// A stage holds several micro-batches in flight, as pipeline schedules need: forwards of three
// micro-batches, then their backwards in order, give bit-identical gradients to running each
// micro-batch's forward and backward in turn (the same ops in the same order per micro-batch,
// and gradients accumulate in the same micro-batch order), and the activations of released
// micro-batches are reused (the peak counts the most held at once). The backward reports
// gradients done from ever lower offsets, ending at 0.
TEST(PipelineStageInFlightTest, MicroBatchesInFlightGiveTheSameGradientsAsOneAtATime) {
  const Split split{"four", 4, 2, true, ModelConfig::LEARNED, true};
  const ModelConfig config = TinyConfig(split);
  const Batch batch = MakeBatch(config.vocab_size());
  auto in_turn = MakeStages(config, split);
  auto in_flight = MakeStages(config, split);
  ASSERT_EQ(in_turn.size(), 2u);
  ASSERT_EQ(in_flight.size(), 2u);
  constexpr int kMicroBatches = 3;
  for (int mb = 0; mb < kMicroBatches; ++mb) RunChained(in_turn, batch);

  // Stage 0 forwards all three (different first samples would change the dropout masks, so
  // they share kFirstSample, as RunChained does), stage 1 runs each as it arrives.
  std::vector<Tensor> grads_to_stage0;
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    auto out =
        in_flight[0]->ForwardStage(mb, &batch.inputs, nullptr, batch.targets, kFirstSample, true);
    NF_ASSERT_OK(out);
    NF_ASSERT_OK(in_flight[1]->ForwardStage(mb, nullptr, *out, batch.targets, kFirstSample, true));
    NF_ASSERT_OK(in_flight[1]->BackwardStage(mb, nullptr, kLossWeight));
    Tensor grad = *Tensor::HostZeros(DType::kF32, in_flight[1]->input_grad().shape());
    NF_ASSERT_OK(ops::Cast(in_flight[1]->input_grad(), grad));
    grads_to_stage0.push_back(grad);
  }
  EXPECT_EQ(in_flight[0]->in_flight(), kMicroBatches);
  std::vector<int64_t> done_from;
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    NF_ASSERT_OK(
        in_flight[0]->BackwardStage(mb, &grads_to_stage0[mb], kLossWeight, [&](int64_t offset) {
          done_from.push_back(offset);
          return absl::OkStatus();
        }));
  }
  EXPECT_EQ(in_flight[0]->in_flight(), 0);
  EXPECT_EQ(in_flight[0]->peak_in_flight(), kMicroBatches);
  EXPECT_EQ(in_flight[1]->peak_in_flight(), 1);
  for (size_t s = 0; s < 2; ++s) {
    for (const ParamTable::Entry& e : in_flight[s]->params().entries()) {
      EXPECT_EQ(*ToFloatVector(e.grad), *ToFloatVector(in_turn[s]->params().Get(e.spec.name).grad))
          << "stage " << s << " " << e.spec.name;
    }
  }
  // Per micro-batch: one report per layer (2 on stage 0), then 0 after the embedding.
  ASSERT_EQ(done_from.size(), 3u * kMicroBatches);
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    EXPECT_GT(done_from[3 * mb], done_from[3 * mb + 1]);
    EXPECT_GT(done_from[3 * mb + 1], 0);
    EXPECT_EQ(done_from[3 * mb + 1],
              in_flight[0]->params().Get("decoder.layers.0.self_attn_layer_norm.weight").offset);
    EXPECT_EQ(done_from[3 * mb + 2], 0);
  }
}

}  // namespace
}  // namespace nf::model
