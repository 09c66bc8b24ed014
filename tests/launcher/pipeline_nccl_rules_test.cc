// The real PipelineExecutor with real NormFormer chunks on the NCCL-rules communicator
// (tests/parallel/nccl_rules_communicator.h), one thread per pipeline rank: for GPipe and 1F1B
// at every p 2-8 and m p..4p, and interleaved 1F1B at every p 2-8, v 2-4 and m p, 2p, 3p, 4p,
// a training step and an evaluation pass complete under NCCL's rules (sends complete only when
// received, groups as a whole, strictly in order) and give the single rank's loss, and every
// parameter's gradient, bit for bit.
//
// Why bit for bit: every stage runs the very ops of the whole model on the same values (stages
// pass exact copies), dropout masks are keyed by global sample and layer, and each chunk
// accumulates its micro-batches' gradients in the reference's order (backwards in
// micro-batch order under 1F1B and interleaving, reverse order under GPipe, as the reference
// of the same kind on one rank). Embeddings are untied: tied ones sum two copies' gradients,
// which reassociates (tests/model/pipeline_stage_test.cc).
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "launcher/pipeline_executor.h"
#include "parallel/local_communicator.h"
#include "parallel/nccl_rules_communicator.h"
#include "parallel/pipeline_layouts.h"
#include "test_util.h"

namespace nf::launcher {
namespace {

using parallel::ScheduleKind;

constexpr int64_t kBatch = 2, kSeq = 4;
constexpr int kVocab = 29;
constexpr float kLossWeight = 0.125f;

model::ModelConfig TinyConfig(int num_layers) {
  model::ModelConfig c;
  c.set_num_layers(num_layers);
  c.set_d_model(8);
  c.set_num_heads(2);
  c.set_ffn_dim(16);
  c.set_vocab_size(kVocab);
  c.set_max_seq_len(kSeq);
  c.set_dropout(0.1f);
  c.set_attention_dropout(0.1f);
  c.set_activation_dropout(0.1f);
  c.set_tie_embeddings(false);
  model::NormFormerConfig* nf = c.mutable_normformer();
  nf->set_scale_attn(true);
  nf->set_scale_heads(true);
  nf->set_scale_fc(true);
  return c;
}

// Micro-batch k of the batch at sample b: ids drawn from (b + 2k), the same on every rank.
class TinyBatches final : public BatchSource {
 public:
  TinyBatches()
      : inputs_(testing::MakeZeros(DType::kI32, {kBatch, kSeq})),
        targets_(testing::MakeZeros(DType::kI32, {kBatch, kSeq})) {}
  absl::StatusOr<int64_t> Load(int64_t batch_start, int64_t micro_batch) override {
    const int64_t first = batch_start + micro_batch * kBatch;
    std::mt19937 rng(static_cast<uint32_t>(first));
    for (int64_t i = 0; i < kBatch * kSeq; ++i) {
      inputs_.data<int32_t>()[i] = static_cast<int32_t>(rng() % kVocab);
      targets_.data<int32_t>()[i] = static_cast<int32_t>(rng() % kVocab);
    }
    return first;
  }
  int64_t stream_size() const override { return INT64_MAX; }
  const Tensor& inputs() const override { return inputs_; }
  const Tensor& targets() const override { return targets_; }
  std::string Describe() const override { return "tiny"; }
  std::vector<int64_t> StreamEpochs() const override { return {}; }

 private:
  Tensor inputs_, targets_;
};

// What a run leaves: the losses of the training step and of the evaluation pass, and every
// parameter's gradient by name.
struct Outcome {
  absl::Status status;
  model::NormFormerModel::LossSum train_loss, eval_loss;
  std::map<std::string, std::vector<uint8_t>> grads;
};

const PipelineStep kStep = {.step = 0,
                            .batch_start = 40,
                            .first_micro_batch = 0,
                            .micro_batch_size = kBatch,
                            .loss_weight = kLossWeight};

// Runs one training step and one evaluation pass on the chunks of one pipeline rank.
absl::Status RunRank(std::vector<std::unique_ptr<model::NormFormerModel>>& chunks,
                     parallel::Communicator& pp, ScheduleKind kind, int m, Outcome& out) {
  std::vector<model::NormFormerModel*> views;
  for (auto& chunk : chunks) views.push_back(chunk.get());
  NF_ASSIGN_OR_RETURN(PipelineExecutor executor, PipelineExecutor::Create(views, pp, kind, m));
  TinyBatches batches;
  NF_RETURN_IF_ERROR(executor.Run(kStep, batches, nullptr).status());
  for (auto& chunk : chunks) {
    NF_ASSIGN_OR_RETURN(const model::NormFormerModel::LossSum loss, chunk->TakeLossSum());
    if (chunk->placement().last()) out.train_loss = loss;
    for (const model::ParamTable::Entry& e : chunk->params().entries()) {
      const auto* bytes = static_cast<const uint8_t*>(e.grad.raw_data());
      out.grads[e.spec.name].assign(bytes, bytes + e.grad.nbytes());
    }
  }
  NF_RETURN_IF_ERROR(executor.RunForwardOnly(kStep, batches).status());
  for (auto& chunk : chunks) {
    NF_ASSIGN_OR_RETURN(const model::NormFormerModel::LossSum loss, chunk->TakeLossSum());
    if (chunk->placement().last()) out.eval_loss = loss;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<model::NormFormerModel>> MakeChunk(int num_layers, int stage,
                                                                  int num_stages, int begin,
                                                                  int end) {
  return model::NormFormerModel::Create(
      TinyConfig(num_layers),
      {.dtype = DType::kF32,
       .micro_batch = kBatch,
       .seq_len = kSeq,
       .seed = 11,
       .pipeline = {
           .stage = stage, .num_stages = num_stages, .layer_begin = begin, .layer_end = end}});
}

// The whole model on one rank, under `kind` (1F1B for interleaving).
Outcome RunSingleRank(ScheduleKind kind, int num_layers, int m) {
  Outcome out;
  std::vector<std::unique_ptr<model::NormFormerModel>> chunks;
  auto whole = MakeChunk(num_layers, 0, 1, 0, num_layers);
  if (!whole.ok()) {
    out.status = whole.status();
    return out;
  }
  chunks.push_back(*std::move(whole));
  parallel::LocalCommunicator pp("pp");
  out.status =
      RunRank(chunks, pp, kind == ScheduleKind::kGPipe ? kind : ScheduleKind::kOneFOneB, m, out);
  return out;
}

// The pipeline on p threads over the NCCL-rules communicator, one layer per model stage.
Outcome RunPipeline(ScheduleKind kind, int p, int v, int m) {
  const int stages = p * v;
  const std::vector<std::pair<int, int>> layers = parallel::StageLayers(stages, p, v);
  testing::NcclRulesFabric fabric(p);
  std::vector<Outcome> outcomes(p);
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      Outcome& out = outcomes[r];
      out.status = [&]() -> absl::Status {
        std::unique_ptr<testing::NcclRulesCommunicator> pp = fabric.Join(r, "pp");
        std::vector<std::unique_ptr<model::NormFormerModel>> chunks;
        for (int c = 0; c < v; ++c) {
          const int s = c * p + r;
          NF_ASSIGN_OR_RETURN(auto chunk,
                              MakeChunk(stages, s, stages, layers[s].first, layers[s].second));
          chunks.push_back(std::move(chunk));
        }
        return RunRank(chunks, *pp, kind, m, out);
      }();
    });
  }
  for (std::thread& t : threads) t.join();
  Outcome merged;
  for (int r = 0; r < p; ++r) {
    if (!outcomes[r].status.ok()) {
      merged.status = absl::Status(outcomes[r].status.code(),
                                   absl::StrCat("rank ", r, ": ", outcomes[r].status.message()));
      return merged;
    }
    if (outcomes[r].train_loss.tokens > 0) merged.train_loss = outcomes[r].train_loss;
    if (outcomes[r].eval_loss.tokens > 0) merged.eval_loss = outcomes[r].eval_loss;
    merged.grads.merge(outcomes[r].grads);
  }
  return merged;
}

using Layout = testing::PipelineLayout;

// Up to 8 stages (the sanitizer pass: 4).
int MaxStages() { return testing::MaxPipelineStages(8); }
std::vector<Layout> Layouts() { return testing::PipelineLayouts(MaxStages()); }

TEST(PipelineNcclRulesTest, EveryScheduleCompletesWithTheSingleRanksLossAndGradients) {
  std::map<std::tuple<bool, int, int>, Outcome> references;  // by (GPipe?, layers, m)
  int runs = 0;
  for (const Layout& l : Layouts()) {
    const std::string name = l.Name();
    const int layers = l.p * l.v;
    const auto key = std::make_tuple(l.kind == ScheduleKind::kGPipe, layers, l.m);
    if (!references.contains(key)) references[key] = RunSingleRank(l.kind, layers, l.m);
    const Outcome& reference = references[key];
    NF_ASSERT_OK(reference.status) << name;
    const Outcome pipeline = RunPipeline(l.kind, l.p, l.v, l.m);
    NF_ASSERT_OK(pipeline.status) << name;
    EXPECT_EQ(pipeline.train_loss.sum, reference.train_loss.sum) << name;
    EXPECT_EQ(pipeline.train_loss.tokens, reference.train_loss.tokens) << name;
    EXPECT_EQ(pipeline.eval_loss.sum, reference.eval_loss.sum) << name;
    ASSERT_EQ(pipeline.grads.size(), reference.grads.size()) << name;
    for (const auto& [param, grad] : reference.grads) {
      const auto it = pipeline.grads.find(param);
      ASSERT_NE(it, pipeline.grads.end()) << name << ": " << param;
      EXPECT_TRUE(it->second == grad) << name << ": the gradient of " << param << " differs";
    }
    ++runs;
  }
  EXPECT_EQ(runs, MaxStages() == 8 ? 2 * 112 + 84 : static_cast<int>(Layouts().size()));
}

}  // namespace
}  // namespace nf::launcher
