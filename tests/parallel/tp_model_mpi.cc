// Tensor-parallel NormFormer against the single-rank model, run under mpirun with 2 and 4 ranks
// forming one tensor-parallel group. Every rank also builds the whole model alone (the
// initialisation is a function of global coordinates, so both start from the same weights)
// and compares its shard of everything with the matching slice of the whole: logits, loss,
// every parameter and every gradient, then the losses of 10 optimizer steps, with and without
// sequence parallelism (whose replicated gradients are summed over the group first: the
// trainer's job, ReduceSequenceParallelGrads here), for the causal and the masked LM. Dropout is on
// in all three places: masks are keyed by global coordinates, so both draw the same ones. With 16
// tokens, tp 4's sequence shards of 4 tokens start inside the samples of 8.
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/optim/mixed_precision_optimizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/normformer_model.h"
#include "mpi_test_util.h"
#include "test_util.h"

namespace nf::model {
namespace {

using ::nf::testing::MakeIds;

constexpr int64_t kBatch = 2, kSeq = 8;

ModelConfig Config(bool fairseq_heads, bool masked_lm = false) {
  ModelConfig c;
  // A masked LM: bidirectional attention, and RoBERTa's head with its vocab-parallel bias.
  if (masked_lm) c.set_objective(ModelConfig::MASKED_LM);
  c.set_num_layers(2);
  c.set_d_model(16);
  c.set_num_heads(4);
  c.set_ffn_dim(32);
  c.set_vocab_size(300);  // padded to 384 (tp 1) or 512 (tp 2, 4): the slices differ in size
  c.set_max_seq_len(8);
  c.set_dropout(0.1f);
  c.set_attention_dropout(0.1f);
  c.set_activation_dropout(0.1f);
  NormFormerConfig* nf = c.mutable_normformer();
  nf->set_scale_resids(true);
  nf->set_head_scale_placement(fairseq_heads ? NormFormerConfig::AFTER_OUT_PROJ
                                             : NormFormerConfig::BEFORE_OUT_PROJ);
  return c;
}

struct Batch {
  Tensor inputs, targets;
};
Batch MakeBatch(int step) {
  std::mt19937 rng(100 + step);
  std::vector<int32_t> in(kBatch * kSeq), out(kBatch * kSeq);
  for (int32_t& t : in) t = static_cast<int32_t>(rng() % 300);
  for (int32_t& t : out) t = static_cast<int32_t>(rng() % 300);
  return {MakeIds({kBatch, kSeq}, in), MakeIds({kBatch, kSeq}, out)};
}

// The slice of a whole parameter (or gradient) `full` that rank r of tp holds under `spec`.
std::vector<float> Slice(const ParamTable::Entry& shard, const std::vector<float>& full, int rank) {
  const Shape& g = shard.spec.global_shape;
  const int64_t cols = g.size() < 2 ? 1 : g[1];
  const int64_t rows = shard.local_shape[0];
  const int64_t local_cols = shard.local_shape.size() < 2 ? 1 : shard.local_shape[1];
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < local_cols; ++c) {
      int64_t gr = r, gc = c;
      if (shard.spec.sharding == Sharding::kSplitRows) gr += rank * rows;
      if (shard.spec.sharding == Sharding::kSplitCols) gc += rank * local_cols;
      out.push_back(full[gr * cols + gc]);
    }
  }
  return out;
}

// (fairseq's head-scale placement, sequence parallelism, masked LM)
class TensorParallelModelTest : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {
 protected:
  bool fairseq_heads() const { return std::get<0>(GetParam()); }
  bool sequence_parallel() const { return std::get<1>(GetParam()); }
  ModelConfig TestConfig() const { return Config(fairseq_heads(), std::get<2>(GetParam())); }
  absl::StatusOr<std::unique_ptr<NormFormerModel>> CreateShard(const ModelConfig& config,
                                                               uint32_t seed) const {
    return NormFormerModel::Create(config, {.micro_batch = kBatch,
                                            .seq_len = kSeq,
                                            .seed = seed,
                                            .tensor_parallel = &::nf::testing::World(),
                                            .sequence_parallel = sequence_parallel()});
  }
};

INSTANTIATE_TEST_SUITE_P(HeadPlacementSequenceParallelismAndObjective, TensorParallelModelTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Bool()));

TEST_P(TensorParallelModelTest, ShardsMatchTheSingleRankModel) {
  parallel::Communicator& tp = ::nf::testing::World();
  const ModelConfig config = TestConfig();
  // The single-rank model pads the vocabulary for tp 1; give it the tp model's padding by
  // comparing only the real vocabulary's rows (padding rows are zero-gradient and never read).
  auto whole = NormFormerModel::Create(config, {.micro_batch = kBatch, .seq_len = kSeq, .seed = 9});
  auto shard = CreateShard(config, 9);
  NF_ASSERT_OK(whole);
  NF_ASSERT_OK(shard);

  const Batch batch = MakeBatch(0);
  auto whole_loss = (*whole)->Forward(batch.inputs, batch.targets, 5, true);
  auto shard_loss = (*shard)->Forward(batch.inputs, batch.targets, 5, true);
  NF_ASSERT_OK(whole_loss);
  NF_ASSERT_OK(shard_loss);
  // fp32 sums in a different order (all-reduced partial GEMMs, split LayerNorm statistics):
  // a few u32 relative per op through two layers, as in the single-rank reference test: 2e-5
  // of the loss sum (16 tokens x ~5.7).
  EXPECT_NEAR(shard_loss->sum, whole_loss->sum, 2e-5 * std::abs(whole_loss->sum));

  // Logits: this rank's vocabulary columns of the whole model's logits (real vocabulary only).
  const int64_t local_vocab = (*shard)->logits().dim(1);
  const std::vector<float> whole_logits = *ToFloatVector((*whole)->logits());
  const std::vector<float> shard_logits = *ToFloatVector((*shard)->logits());
  for (int64_t t = 0; t < kBatch * kSeq; ++t) {
    for (int64_t v = 0; v < local_vocab; ++v) {
      const int64_t global = (*shard)->vocab_offset() + v;
      if (global >= 300) continue;
      // Logits of magnitude ~1-3 computed in fp32 in two orders: 2e-5 absolute.
      ASSERT_NEAR(shard_logits[t * local_vocab + v],
                  whole_logits[t * (*whole)->padded_vocab() + global], 2e-5)
          << "token " << t << " vocab " << global;
    }
  }

  NF_ASSERT_OK((*whole)->Backward(1.0f));
  NF_ASSERT_OK((*shard)->Backward(1.0f));
  NF_ASSERT_OK((*shard)->ReduceSequenceParallelGrads());
  for (const ParamTable::Entry& e : (*shard)->params().entries()) {
    SCOPED_TRACE(e.spec.name);
    const ParamTable::Entry& w = (*whole)->params().Get(e.spec.name);
    std::vector<float> whole_value = *ToFloatVector(w.value), whole_grad = *ToFloatVector(w.grad);
    // The vocabulary's tables (the embedding, the masked LM's output bias): the whole model's
    // have 384 rows, the tp 2 and tp 4 models' 512: pad them.
    const bool vocab =
        e.spec.name == "decoder.embed_tokens.weight" || e.spec.name == "decoder.lm_head.bias";
    if (vocab) {
      whole_value.resize(NumElements(e.spec.global_shape), 0.0f);
      whole_grad.resize(NumElements(e.spec.global_shape), 0.0f);
    }
    const std::vector<float> value = *ToFloatVector(e.value), grad = *ToFloatVector(e.grad);
    const std::vector<float> expected_value = Slice(e, whole_value, tp.rank());
    const std::vector<float> expected_grad = Slice(e, whole_grad, tp.rank());
    float largest = 1e-3f;
    for (float g : expected_grad) largest = std::max(largest, std::abs(g));
    const int64_t width = e.local_shape.size() < 2 ? 1 : e.local_shape[1];
    for (size_t i = 0; i < grad.size(); ++i) {
      // Padding rows of the vocabulary differ in number between the layouts; they are never
      // read (no id reaches them) and get no gradient.
      if (vocab && (*shard)->vocab_offset() + static_cast<int64_t>(i) / width >= 300) continue;
      // Each rank holds exactly the slice its ParamSpec declares (bit-identical init).
      ASSERT_EQ(value[i], expected_value[i]) << "element " << i;
      // Gradients: fp32 in a different summation order, 1e-4 of the parameter's largest
      // gradient (the single-rank test's bound against float64 is the same), plus a floor of
      // 1e-6 for parameters whose exact gradient is 0: k_proj.bias shifts every score of a
      // row by the same q.b_k, which softmax ignores, so both sides are pure fp32 rounding of
      // O(0.1) terms (measured 1.4e-7).
      ASSERT_NEAR(grad[i], expected_grad[i], 1e-4f * largest + 1e-6f) << "element " << i;
    }
  }
}

// Replicated parameters (LayerNorms, the residual scale, the row-parallel biases, and the head
// scales in fairseq's placement) see the same inputs and gradients on every rank (or, with
// sequence parallelism, are summed over the group), so their gradients must be bit-identical
// across the group; and the global gradient norm counts them
// once: the owned squared norms, summed over the group, equal the single-rank model's.
TEST_P(TensorParallelModelTest, ReplicatedGradientsAgreeBitwiseAndCountOnceInTheNorm) {
  parallel::Communicator& tp = ::nf::testing::World();
  const ModelConfig config = TestConfig();
  auto whole = NormFormerModel::Create(config, {.micro_batch = kBatch, .seq_len = kSeq, .seed = 4});
  auto shard = CreateShard(config, 4);
  NF_ASSERT_OK(whole);
  NF_ASSERT_OK(shard);
  const Batch batch = MakeBatch(1);
  for (NormFormerModel* m : {whole->get(), shard->get()}) {
    NF_ASSERT_OK(m->Forward(batch.inputs, batch.targets, 0, true));
    NF_ASSERT_OK(m->Backward(1.0f));
    NF_ASSERT_OK(m->ReduceSequenceParallelGrads());
  }
  int replicated = 0;
  for (const ParamTable::Entry& e : (*shard)->params().entries()) {
    if (e.spec.sharding != Sharding::kReplicated) continue;
    ++replicated;
    Tensor all = *Tensor::HostZeros(DType::kF32, {tp.size() * e.grad.numel()});
    NF_ASSERT_OK(tp.AllGather(*e.grad.Reshape({e.grad.numel()}), all));
    const std::vector<float> gathered = *ToFloatVector(all);
    for (int r = 1; r < tp.size(); ++r) {
      for (int64_t i = 0; i < e.grad.numel(); ++i) {
        ASSERT_EQ(gathered[r * e.grad.numel() + i], gathered[i])
            << e.spec.name << " rank " << r << " element " << i;
      }
    }
  }
  EXPECT_GT(replicated, 10);
  Tensor norm = *Tensor::HostZeros(DType::kF64, {1});
  norm.data<double>()[0] = *(*shard)->params().OwnedSquaredGradNorm();
  NF_ASSERT_OK(tp.AllReduce(norm, parallel::ReduceOp::kSum));
  const double whole_norm = *(*whole)->params().OwnedSquaredGradNorm();
  // fp32 sums of squares in a different order, over gradients that agree to 1e-4 relative
  // (previous test): 1e-4 relative on the squared norm.
  EXPECT_NEAR(norm.data<double>()[0], whole_norm, 1e-4 * whole_norm);
}

// Overlapping the column-parallel input-gradient reductions with the weight gradients (the
// default) reorders independent work only: loss and every gradient bit-identical to the
// one-after-the-other path.
TEST_P(TensorParallelModelTest, OverlappedReductionsGiveBitIdenticalGradients) {
  const ModelConfig config = TestConfig();
  std::vector<float> grads[2];
  double losses[2];
  for (const bool overlap : {false, true}) {
    auto model = NormFormerModel::Create(config, {.micro_batch = kBatch,
                                                  .seq_len = kSeq,
                                                  .seed = 6,
                                                  .tensor_parallel = &::nf::testing::World(),
                                                  .sequence_parallel = sequence_parallel(),
                                                  .overlap_tensor_parallel_comm = overlap});
    NF_ASSERT_OK(model);
    const Batch batch = MakeBatch(2);
    auto loss = (*model)->Forward(batch.inputs, batch.targets, 0, true);
    NF_ASSERT_OK(loss);
    NF_ASSERT_OK((*model)->Backward(1.0f));
    losses[overlap] = loss->sum;
    grads[overlap] = *ToFloatVector((*model)->params().grads());
  }
  EXPECT_EQ(losses[1], losses[0]);
  EXPECT_EQ(grads[1], grads[0]);
}

TEST_P(TensorParallelModelTest, TenOptimizerStepsKeepTheLossesTogether) {
  const ModelConfig config = TestConfig();
  auto whole = NormFormerModel::Create(config, {.micro_batch = kBatch, .seq_len = kSeq, .seed = 3});
  auto shard = CreateShard(config, 3);
  NF_ASSERT_OK(whole);
  NF_ASSERT_OK(shard);
  std::vector<optim::MixedPrecisionAdamW> optimizers;
  for (NormFormerModel* m : {whole->get(), shard->get()}) {
    // No clipping: the global gradient norm needs reductions over groups (issue 7).
    auto o = optim::MixedPrecisionAdamW::Create(
        m->params().params(), m->params().grads(), m->params().DecayRanges(),
        {.beta1 = 0.9f, .beta2 = 0.98f, .eps = 1e-8f, .weight_decay = 0.01f, .clip_grad = 0.0f});
    NF_ASSERT_OK(o);
    optimizers.push_back(*std::move(o));
  }
  for (int step = 0; step < 10; ++step) {
    const Batch batch = MakeBatch(step);
    double losses[2];
    for (int k = 0; k < 2; ++k) {
      NormFormerModel& m = k == 0 ? **whole : **shard;
      NF_ASSERT_OK(m.params().ZeroGrads());
      auto loss = m.Forward(batch.inputs, batch.targets, step * kBatch, true);
      NF_ASSERT_OK(loss);
      losses[k] = loss->sum / loss->tokens;
      NF_ASSERT_OK(m.Backward(1.0f / (kBatch * kSeq)));
      NF_ASSERT_OK(m.ReduceSequenceParallelGrads());
      NF_ASSERT_OK(optimizers[k].Step(1e-2f, 1.0f));
    }
    // Adam normalises each update, so fp32 differences of ~1e-6 in the gradients move the
    // weights by ~lr * 1e-6 / sqrt(v) per step; after 10 steps at lr 1e-2 the mean losses
    // (~5.7) still agree to 1e-4 relative. Measured differences are ~1e-6.
    EXPECT_NEAR(losses[1], losses[0], 1e-4 * losses[0]) << "step " << step;
  }
}

// Resets tp's counts, then runs one forward and backward of batch 0 through `model`: the
// counts then hold that micro-batch's communication.
void CountOneForwardAndBackward(NormFormerModel& model, parallel::Communicator& tp) {
  const Batch batch = MakeBatch(0);
  tp.ResetStats();
  NF_ASSERT_OK(model.Forward(batch.inputs, batch.targets, 0, true));
  NF_ASSERT_OK(model.Backward(1.0f));
}

TEST(TensorParallelVolumeTest, BytesPerStepMatchTheLayerFormulas) {
  parallel::Communicator& tp = ::nf::testing::World();
  const ModelConfig config = Config(false);
  auto shard = NormFormerModel::Create(
      config, {.micro_batch = kBatch, .seq_len = kSeq, .seed = 3, .tensor_parallel = &tp});
  NF_ASSERT_OK(shard);
  CountOneForwardAndBackward(**shard, tp);
  // All-reduce payloads of one forward and backward, T = tokens, d = d_model, L layers, fp32:
  //   embedding output           T d 4
  //   per layer forward          out_proj T d 4 + fc2 T d 4 + LN_ffn_mid stats T 2 8 (f64)
  //   per layer backward         LN_ffn_mid sums T 2 4 + fc1 input grad T d 4
  //                              + q/k/v input grad T d 4
  //   loss                       row max T 4 + (sum exp, target logit) 2 T 4
  //   head backward              T d 4
  const int64_t t = kBatch * kSeq, d = 16, layers = 2;
  const int64_t expected = t * d * 4 + layers * (2 * t * d * 4 + t * 2 * 8) +
                           layers * (t * 2 * 4 + 2 * t * d * 4) + t * 4 + 2 * t * 4 + t * d * 4;
  const auto& stats = tp.stats();
  EXPECT_EQ(stats.bytes[static_cast<int>(parallel::CommOp::kAllReduce)], expected);
  EXPECT_EQ(stats.total_bytes(), expected);  // nothing but all-reduces
  EXPECT_EQ(stats.calls[static_cast<int>(parallel::CommOp::kAllReduce)], 1 + layers * 6 + 3);
}

// The default model (head scales before out_proj) over the world with sequence parallelism.
absl::StatusOr<std::unique_ptr<NormFormerModel>> SequenceParallelModel(int64_t micro_batch,
                                                                       int64_t seq_len) {
  return NormFormerModel::Create(Config(false), {.micro_batch = micro_batch,
                                                 .seq_len = seq_len,
                                                 .seed = 3,
                                                 .tensor_parallel = &::nf::testing::World(),
                                                 .sequence_parallel = true});
}

// Sequence parallelism turns each [T, d] all-reduce into a reduce-scatter (the input's T d 4
// bytes) or an all-gather (the output's T d 4), and adds the all-gathers of the inputs that the
// backward needs again (the q/k/v and fc1 inputs, the final LayerNorm's output: kept as [T/tp, d]
// rows, gathered again rather than stored whole). Per rank, T tokens, d, L layers, fp32:
//   reduce-scatter   embedding output; per layer out_proj, fc2 (forward), fc1 and q/k/v input
//                    grads (backward); head input grad:               (2 + 4 L) T d 4
//   all-gather       per layer q/k/v and fc1 inputs (forward and again in the backward), fc2
//                    and out_proj output grads; the head's input (forward and backward); the
//                    embedding's output grad:                          (3 + 6 L) T d 4
//   all-reduce       per layer LN_ffn_mid stats T 2 8 and sums T 2 4; loss T 4 + 2 T 4
TEST(TensorParallelVolumeTest, SequenceParallelBytesPerStepMatchTheLayerFormulas) {
  parallel::Communicator& tp = ::nf::testing::World();
  auto shard = SequenceParallelModel(kBatch, kSeq);
  NF_ASSERT_OK(shard);
  CountOneForwardAndBackward(**shard, tp);
  const int64_t t = kBatch * kSeq, d = 16, layers = 2;
  const auto& stats = tp.stats();
  const auto bytes = [&](parallel::CommOp op) { return stats.bytes[static_cast<int>(op)]; };
  const auto calls = [&](parallel::CommOp op) { return stats.calls[static_cast<int>(op)]; };
  EXPECT_EQ(bytes(parallel::CommOp::kReduceScatter), (2 + 4 * layers) * t * d * 4);
  EXPECT_EQ(calls(parallel::CommOp::kReduceScatter), 2 + 4 * layers);
  EXPECT_EQ(bytes(parallel::CommOp::kAllGather), (3 + 6 * layers) * t * d * 4);
  EXPECT_EQ(calls(parallel::CommOp::kAllGather), 3 + 6 * layers);
  EXPECT_EQ(bytes(parallel::CommOp::kAllReduce),
            layers * (t * 2 * 8 + t * 2 * 4) + t * 4 + 2 * t * 4);
  EXPECT_EQ(calls(parallel::CommOp::kAllReduce), layers * 2 + 2);
  // The replicated gradients' sum: one coalesced all-reduce of every replicated parameter.
  int64_t replicated = 0;
  for (const optim::FlatRange& r : (*shard)->SequenceParallelGradRanges()) replicated += r.length;
  tp.ResetStats();
  NF_ASSERT_OK((*shard)->ReduceSequenceParallelGrads());
  EXPECT_EQ(calls(parallel::CommOp::kAllReduce), 1);
  EXPECT_EQ(bytes(parallel::CommOp::kAllReduce), replicated * 4);
  EXPECT_EQ(stats.total_bytes(), replicated * 4);
}

// A micro-batch whose tokens do not split evenly over the group is refused at creation, naming
// the sizes; incremental decoding, whose steps hold a token per sample, refuses the split.
TEST(SequenceParallelTest, RefusesTokensThatDoNotSplitAndKvCaches) {
  parallel::Communicator& tp = ::nf::testing::World();
  auto uneven = SequenceParallelModel(1, 7);
  ASSERT_FALSE(uneven.ok());
  EXPECT_THAT(uneven.status().message(),
              ::testing::HasSubstr("micro_batch_size x seq_len (1 x 7) must be a multiple of "
                                   "tensor_parallel (" +
                                   std::to_string(tp.size()) + ")"));
  auto split = SequenceParallelModel(kBatch, kSeq);
  NF_ASSERT_OK(split);
  EXPECT_EQ((*split)->hidden_shape(), (Shape{kBatch * kSeq / tp.size(), 16}));
  const absl::Status kv = (*split)->StartKvCache(kSeq);
  EXPECT_EQ(kv.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(kv.message(), ::testing::HasSubstr("without sequence parallelism"));
}

}  // namespace
}  // namespace nf::model
