// The NormFormer model against the independent float64 reference (reference_model.h): logits
// and loss of the fp32 forward, and every parameter's gradient against central finite
// differences of the reference, for each NormFormer switch setting and both head-scale
// placements, with all three dropouts on (masks are fixed by their Philox coordinates, so the
// loss is a smooth function of the parameters and finite differences apply).
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/normformer_model.h"
#include "reference_model.h"
#include "test_util.h"

namespace nf::model {
namespace {

using ::nf::testing::MakeIds;
using ::nf::testing::ReferenceModel;

constexpr int64_t kBatch = 2, kSeq = 6;
constexpr uint32_t kSeed = 17;
constexpr uint64_t kFirstSample = 3;

struct Variant {
  std::string name;
  bool scale_attn, scale_heads, heads_after, scale_fc, scale_resids;
  ModelConfig::Positions positions = ModelConfig::SINUSOIDAL;
  bool tie = true;
  ModelConfig::Activation activation = ModelConfig::GELU;
  int first_position = 2;  // fairseq's numbering; 0 is that of checkpoints before the field
  ModelConfig::Objective objective = ModelConfig::CAUSAL_LM;
};

ModelConfig TinyConfig(const Variant& v) {
  ModelConfig c;
  c.set_num_layers(2);
  c.set_d_model(8);
  c.set_num_heads(2);
  c.set_ffn_dim(16);
  c.set_vocab_size(37);  // padded to 128: 91 rows that must never be predicted
  c.set_max_seq_len(8);
  c.set_positions(v.positions);
  c.set_first_position(v.first_position);
  c.set_activation(v.activation);
  c.set_dropout(0.1f);
  c.set_attention_dropout(0.1f);
  c.set_activation_dropout(0.1f);
  c.set_tie_embeddings(v.tie);
  c.set_objective(v.objective);
  NormFormerConfig* nf = c.mutable_normformer();
  nf->set_scale_attn(v.scale_attn);
  nf->set_scale_heads(v.scale_heads);
  nf->set_head_scale_placement(v.heads_after ? NormFormerConfig::AFTER_OUT_PROJ
                                             : NormFormerConfig::BEFORE_OUT_PROJ);
  nf->set_scale_fc(v.scale_fc);
  nf->set_scale_resids(v.scale_resids);
  return c;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch MakeBatch(int vocab) {
  std::mt19937 rng(5);
  Batch b;
  for (int64_t i = 0; i < kBatch * kSeq; ++i) {
    b.inputs.push_back(static_cast<int32_t>(rng() % vocab));
    b.targets.push_back(static_cast<int32_t>(rng() % vocab));
  }
  b.targets[4] = -1;  // one position without a loss
  return b;
}

std::unique_ptr<NormFormerModel> MakeModel(const ModelConfig& config,
                                           Recompute recompute = Recompute::kNone) {
  auto model = NormFormerModel::Create(config, {.dtype = DType::kF32,
                                                .micro_batch = kBatch,
                                                .seq_len = kSeq,
                                                .recompute = recompute,
                                                .seed = kSeed});
  NF_EXPECT_OK(model);
  return *std::move(model);
}

class ModelReferenceTest : public ::testing::TestWithParam<Variant> {};

INSTANTIATE_TEST_SUITE_P(
    Switches, ModelReferenceTest,
    ::testing::Values(Variant{"normformer", true, true, false, true, false},
                      Variant{"normformer_fairseq_heads", true, true, true, true, false},
                      Variant{"normformer_resid_learned_untied", true, true, false, true, true,
                              ModelConfig::LEARNED, false, ModelConfig::GELU_TANH},
                      Variant{"baseline", false, false, false, false, false},
                      Variant{"baseline_relu2_learned", false, false, false, false, false,
                              ModelConfig::LEARNED, true, ModelConfig::RELU_SQUARED},
                      Variant{"normformer_positions_from_0", true, true, false, true, false,
                              ModelConfig::SINUSOIDAL, true, ModelConfig::GELU, 0},
                      Variant{"baseline_learned_positions_from_5", false, false, false, false,
                              false, ModelConfig::LEARNED, true, ModelConfig::GELU, 5},
                      Variant{"masked_lm_normformer", true, true, false, true, true,
                              ModelConfig::LEARNED, true, ModelConfig::GELU, 2,
                              ModelConfig::MASKED_LM},
                      Variant{"masked_lm_baseline_untied", false, false, false, false, false,
                              ModelConfig::LEARNED, false, ModelConfig::GELU_TANH, 2,
                              ModelConfig::MASKED_LM},
                      Variant{"masked_lm_fairseq_heads_sinusoidal", true, true, true, true, false,
                              ModelConfig::SINUSOIDAL, true, ModelConfig::RELU_SQUARED, 2,
                              ModelConfig::MASKED_LM}),
    [](const ::testing::TestParamInfo<Variant>& info) { return info.param.name; });

TEST_P(ModelReferenceTest, ForwardMatchesFloat64Reference) {
  const ModelConfig config = TinyConfig(GetParam());
  auto model = MakeModel(config);
  const Batch batch = MakeBatch(config.vocab_size());
  auto loss = model->Forward(MakeIds({kBatch, kSeq}, batch.inputs),
                             MakeIds({kBatch, kSeq}, batch.targets), kFirstSample, true);
  NF_ASSERT_OK(loss);
  EXPECT_EQ(loss->tokens, kBatch * kSeq - 1);

  const ReferenceModel ref(config, model->params(), kBatch, kSeq, kSeed, kFirstSample, true);
  ReferenceModel::Matrix ref_logits;
  const double ref_loss = ref.Loss(batch.inputs, batch.targets, &ref_logits);
  const std::vector<float> logits = *ToFloatVector(model->logits());
  ASSERT_EQ(logits.size(), ref_logits.size());
  // fp32 through 2 layers of ~20 ops, each a few u32 (6e-8) relative, amplified by LayerNorm's
  // 1/sigma (<= ~10 here) and sums over d = 8..16 terms: ~1e-5 relative to the logits' scale.
  // Measured errors are ~1e-6; 2e-5 absolute against logits of magnitude ~1-3 leaves margin.
  double worst = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    worst = std::max(worst, std::abs(logits[i] - ref_logits[i]));
  }
  EXPECT_LT(worst, 2e-5);
  // The loss sums 11 token losses of ~ln(37) = 3.6 each, each within the logits' error.
  EXPECT_NEAR(loss->sum, ref_loss, 11 * 4e-5);
}

TEST_P(ModelReferenceTest, EveryGradientMatchesFiniteDifferences) {
  const ModelConfig config = TinyConfig(GetParam());
  auto model = MakeModel(config);
  const Batch batch = MakeBatch(config.vocab_size());
  NF_ASSERT_OK(model->Forward(MakeIds({kBatch, kSeq}, batch.inputs),
                              MakeIds({kBatch, kSeq}, batch.targets), kFirstSample, true));
  NF_ASSERT_OK(model->Backward(1.0f));  // gradient of the summed loss

  ReferenceModel ref(config, model->params(), kBatch, kSeq, kSeed, kFirstSample, true);
  for (const ParamTable::Entry& e : model->params().entries()) {
    SCOPED_TRACE(e.spec.name);
    const std::vector<float> grad = *ToFloatVector(e.grad);
    ReferenceModel::Matrix& values = ref.params.at(e.spec.name);
    // Check up to 6 elements spread over the parameter (all of the small ones). For the
    // embedding also every row the batch touches is covered by the spread, and padding rows
    // (>= 37), which no target may pull on, must have a zero gradient.
    std::vector<size_t> indices;
    const size_t n = values.size();
    for (size_t k = 0; k < std::min<size_t>(n, 6); ++k) indices.push_back(k * (n - 1) / 5);
    if (e.spec.name == "decoder.embed_tokens.weight") {
      for (int32_t id : batch.inputs) indices.push_back(id * 8 + 3);
      for (size_t i = 37 * 8; i < n; ++i) ASSERT_EQ(grad[i], 0.0f) << "padding element " << i;
    }
    if (e.spec.name == "decoder.lm_head.bias") {
      for (size_t i = 37; i < n; ++i) ASSERT_EQ(grad[i], 0.0f) << "padding element " << i;
    }
    double grad_scale = 1e-3;
    for (float g : grad) grad_scale = std::max(grad_scale, static_cast<double>(std::abs(g)));
    if (e.spec.name.ends_with("k_proj.bias")) {
      // The key bias shifts all logits of a query row by one amount, which softmax ignores: its
      // exact gradient is 0 and the fp32 one is the rounding residue of sums that cancel, terms
      // on the scale of the key weight's gradient (measured ~1e-7 against a 1e-7 floor, so
      // the floor alone passes or fails with the initial values drawn). Scale it by that.
      const std::string weight = e.spec.name.substr(0, e.spec.name.size() - 4) + "weight";
      const std::vector<float> weight_grad = *ToFloatVector(model->params().Get(weight).grad);
      for (float g : weight_grad) {
        grad_scale = std::max(grad_scale, static_cast<double>(std::abs(g)));
      }
    }
    for (size_t i : indices) {
      const double saved = values[i];
      const double h = 1e-5;
      values[i] = saved + h;
      const double up = ref.Loss(batch.inputs, batch.targets);
      values[i] = saved - h;
      const double down = ref.Loss(batch.inputs, batch.targets);
      values[i] = saved;
      const double numeric = (up - down) / (2 * h);
      // Central differences in double: truncation ~h^2 |f'''| ~ 1e-10, cancellation ~1e-16 *
      // loss / h ~ 1e-10: the numeric value is exact to ~1e-9. The analytic gradient is fp32
      // through forward and backward (~1e-5 relative, as for the logits), so the bound is
      // 1e-4 of the parameter's largest gradient plus 1e-3 relative.
      EXPECT_NEAR(grad[i], numeric, 1e-4 * grad_scale + 1e-3 * std::abs(numeric))
          << "element " << i;
    }
  }
}

// Selective and full recompute against none, with dropout on everywhere, for both head-scale
// placements (the selective recompute merges the heads again, scaled before out_proj).
TEST(ModelTest, ActivationRecomputeGivesBitIdenticalLossAndGradients) {
  for (const bool fairseq_heads : {false, true}) {
    const ModelConfig config = TinyConfig({"normformer", true, true, fairseq_heads, true, true});
    const Batch batch = MakeBatch(config.vocab_size());
    std::vector<float> grads[3];
    double losses[3];
    const Recompute modes[] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
    for (int m = 0; m < 3; ++m) {
      auto model = MakeModel(config, modes[m]);
      auto loss = model->Forward(MakeIds({kBatch, kSeq}, batch.inputs),
                                 MakeIds({kBatch, kSeq}, batch.targets), kFirstSample, true);
      NF_ASSERT_OK(loss);
      NF_ASSERT_OK(model->Backward(0.25f));
      losses[m] = loss->sum;
      grads[m] = *ToFloatVector(model->params().grads());
    }
    for (int m = 1; m < 3; ++m) {
      SCOPED_TRACE(absl::StrCat("fairseq heads ", fairseq_heads, ", mode ", m));
      EXPECT_EQ(losses[m], losses[0]);
      EXPECT_EQ(grads[m], grads[0]);
    }
  }
}

// What each mode keeps per layer: selective drops the attention output, its log-sum-exp and the
// merged heads (2 T H Dh elements and B H S floats), full keeps none of a layer's activations.
TEST(ModelTest, SelectiveRecomputeKeepsLessThanNone) {
  const ModelConfig config = TinyConfig({"normformer", true, true, false, true, true});
  const ModelOptions options{.micro_batch = kBatch, .seq_len = kSeq};
  const LayerShape shape = LayerShapeOf(config, options, 0, 1);
  const int64_t none = LayerActivations::Bytes(shape, LayerOptionsOf(config, Recompute::kNone));
  const int64_t selective =
      LayerActivations::Bytes(shape, LayerOptionsOf(config, Recompute::kSelective));
  const int64_t t = kBatch * kSeq, width = shape.local_width();
  EXPECT_EQ(none - selective, (2 * t * width + shape.batch * shape.heads * shape.seq) * 4);
}

TEST(ModelTest, GradientsAccumulateOverMicroBatches) {
  const ModelConfig config = TinyConfig({"normformer", true, true, false, true, false});
  const Batch batch = MakeBatch(config.vocab_size());
  auto model = MakeModel(config);
  const Tensor inputs = MakeIds({kBatch, kSeq}, batch.inputs);
  const Tensor targets = MakeIds({kBatch, kSeq}, batch.targets);
  NF_ASSERT_OK(model->Forward(inputs, targets, kFirstSample, true));
  NF_ASSERT_OK(model->Backward(1.0f));
  const std::vector<float> once = *ToFloatVector(model->params().grads());
  NF_ASSERT_OK(model->Forward(inputs, targets, kFirstSample, true));
  NF_ASSERT_OK(model->Backward(1.0f));
  const std::vector<float> twice = *ToFloatVector(model->params().grads());
  // The second pass adds its pieces (bias sums, GEMM products, LayerNorm partials) onto the
  // first's totals instead of onto zero, so the fp32 roundings differ: within a few ulps of the
  // largest gradient (8 u32 of it).
  float largest = 0.0f;
  for (float g : once) largest = std::max(largest, std::abs(g));
  for (size_t i = 0; i < once.size(); ++i) {
    ASSERT_NEAR(twice[i], 2 * once[i], 8 * 0x1p-24 * 2 * largest) << i;
  }
  NF_ASSERT_OK(model->params().ZeroGrads());
  const std::vector<float> zeroed = *ToFloatVector(model->params().grads());
  for (float g : zeroed) ASSERT_EQ(g, 0.0f);
}

TEST(ModelTest, EvaluationTurnsDropoutOffAndDropoutMasksFollowTheSample) {
  const ModelConfig config = TinyConfig({"normformer", true, true, false, true, false});
  const Batch batch = MakeBatch(config.vocab_size());
  auto model = MakeModel(config);
  const Tensor inputs = MakeIds({kBatch, kSeq}, batch.inputs);
  const Tensor targets = MakeIds({kBatch, kSeq}, batch.targets);
  const double eval_a = model->Forward(inputs, targets, 0, false)->sum;
  const double eval_b = model->Forward(inputs, targets, 99, false)->sum;
  const double train_a = model->Forward(inputs, targets, 0, true)->sum;
  const double train_b = model->Forward(inputs, targets, 99, true)->sum;
  EXPECT_EQ(eval_a, eval_b);    // no dropout: the sample index does not matter
  EXPECT_NE(train_a, train_b);  // other samples, other masks
  EXPECT_NE(train_a, eval_a);
}

TEST(ModelTest, RejectsInconsistentShapes) {
  ModelConfig config = TinyConfig({"normformer", true, true, false, true, false});
  config.set_num_heads(3);
  auto bad = NormFormerModel::Create(config, {.micro_batch = 1, .seq_len = 4});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("num_heads"), absl::string_view::npos) << bad.status();
  config.set_num_heads(2);
  auto too_long = NormFormerModel::Create(config, {.micro_batch = 1, .seq_len = 9});
  EXPECT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("max_seq_len"), absl::string_view::npos);
}

}  // namespace
}  // namespace nf::model
