// A model made to run forwards only (ModelOptions::gradients false: nf-eval's and nf-generate's,
// eval::CreateStageModel): it holds no gradient buffer and no backward buffers and keeps one set
// of layer activations for every layer, so that it needs little more than its parameters; its
// forwards give a training model's losses bit for bit (dropout on or off); one to be loaded is
// not initialised; a backward, and what needs gradients, are refused by name.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "assert_ok.h"
#include "core/allocator_usage.h"
#include "gmock/gmock.h"
#include "model/normformer_model.h"
#include "test_util.h"

namespace nf::model {
namespace {

using ::nf::testing::MakeIds;
using ::testing::HasSubstr;

constexpr int64_t kBatch = 2, kSeq = 32;

// 4 layers of d 64, ffn 256: the layer activations outweigh the rest, as at full size.
ModelConfig Config() {
  ModelConfig c;
  c.set_num_layers(4);
  c.set_d_model(64);
  c.set_num_heads(4);
  c.set_ffn_dim(256);
  c.set_vocab_size(97);
  c.set_max_seq_len(kSeq);
  c.set_dropout(0.1f);
  c.set_attention_dropout(0.1f);
  return c;
}

std::unique_ptr<NormFormerModel> Make(bool gradients) {
  auto model = NormFormerModel::Create(
      Config(), {.micro_batch = kBatch, .seq_len = kSeq, .seed = 5, .gradients = gradients});
  NF_EXPECT_OK(model);
  if (!model.ok()) std::abort();
  return *std::move(model);
}

std::vector<int32_t> RandomIds(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(kBatch * kSeq);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % 97);
  return ids;
}

// The bytes a model holds once it has run a forward (its buffers and one micro-batch in flight).
int64_t BytesHeldAfterAForward(bool gradients) {
  const int64_t before = CpuAllocatorUsage().live_bytes;
  auto model = Make(gradients);
  const Tensor inputs = MakeIds({kBatch, kSeq}, RandomIds(1));
  const Tensor targets = MakeIds({kBatch, kSeq}, RandomIds(2));
  NF_EXPECT_OK(model->ForwardStage(0, &inputs, nullptr, targets, 0, /*train=*/false).status());
  return CpuAllocatorUsage().live_bytes - before;
}

TEST(ForwardOnlyModelTest, HoldsNeitherGradientsNorEveryLayersActivations) {
  auto model = Make(/*gradients=*/false);
  EXPECT_FALSE(model->params().has_gradients());
  for (const ParamTable::Entry& e : model->params().entries()) {
    EXPECT_FALSE(e.grad.defined()) << e.spec.name;
  }
  const int64_t training = BytesHeldAfterAForward(true);
  const int64_t forward_only = BytesHeldAfterAForward(false);
  const int64_t params = model->params().params().nbytes();
  const int64_t layer_acts = LayerActivations::Bytes(
      LayerShapeOf(Config(), {.micro_batch = kBatch, .seq_len = kSeq}, 0, 1),
      LayerOptionsOf(Config(), Recompute::kNone));
  std::printf(
      "bytes held after a forward: training model %lld, forward-only %lld (parameters "
      "%lld, one layer's activations %lld)\n",
      static_cast<long long>(training), static_cast<long long>(forward_only),
      static_cast<long long>(params), static_cast<long long>(layer_acts));
  // The gradients (fp32, as large as the fp32 parameters), three of the four layers'
  // activations and the backward's scratch (at least its [T, ffn] and [T, d] buffers) are gone,
  // and nothing else grew.
  const int64_t tokens = kBatch * kSeq, f32 = 4;
  const int64_t backward_scratch = tokens * (2 * 256 + 2 * 64) * f32;
  EXPECT_LE(forward_only, training - params - 3 * layer_acts - backward_scratch);
}

TEST(ForwardOnlyModelTest, ItsForwardsGiveTheTrainingModelsLossesBitForBit) {
  for (const bool train : {false, true}) {  // dropout off, then on
    auto training = Make(true);
    auto forward_only = Make(false);
    for (uint32_t batch = 0; batch < 3; ++batch) {
      const Tensor inputs = MakeIds({kBatch, kSeq}, RandomIds(10 + batch));
      const Tensor targets = MakeIds({kBatch, kSeq}, RandomIds(20 + batch));
      const absl::StatusOr<NormFormerModel::LossSum> want =
          training->Forward(inputs, targets, batch * kBatch, train);
      const absl::StatusOr<NormFormerModel::LossSum> got =
          forward_only->Forward(inputs, targets, batch * kBatch, train);
      NF_ASSERT_OK(want);
      NF_ASSERT_OK(got);
      EXPECT_EQ(got->sum, want->sum) << "batch " << batch << (train ? " with dropout" : "");
      EXPECT_EQ(got->tokens, want->tokens);
    }
  }
}

TEST(ForwardOnlyModelTest, AModelToBeLoadedIsNotInitialised) {
  auto model = NormFormerModel::Create(
      Config(), {.micro_batch = kBatch, .seq_len = kSeq, .gradients = false, .initialize = false});
  NF_ASSERT_OK(model);
  const Tensor& params = (*model)->params().params();
  for (int64_t i = 0; i < params.numel(); ++i) {
    ASSERT_EQ(params.data<float>()[i], 0.0f) << "element " << i;
  }
}

TEST(ForwardOnlyModelTest, RefusesABackwardAndWhatNeedsGradients) {
  auto model = Make(/*gradients=*/false);
  const Tensor inputs = MakeIds({kBatch, kSeq}, RandomIds(1));
  const Tensor targets = MakeIds({kBatch, kSeq}, RandomIds(2));
  NF_ASSERT_OK(model->Forward(inputs, targets, 0, /*train=*/true).status());
  const absl::Status backward = model->Backward(1.0f);
  EXPECT_EQ(backward.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(backward.message(), HasSubstr("made without gradients"));
  EXPECT_THAT(model->params().ZeroGrads().message(),
              HasSubstr("ZeroGrads: the parameters have no gradients"));
  EXPECT_EQ(model->OwnedSquaredGradNorm().status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace nf::model
