// Incremental decoding against the full forward: a model whose parameters were trained a few SGD
// steps (so the NormFormer scales and LayerNorms have moved from 1 and 0) runs a sequence one
// token (or a chunk) at a time through its KV cache, and every step's logits equal the rows a
// full forward of the whole sequence gives for the same positions (causal attention: row t of
// the full forward is the logits of the prefix 0..t).
//
// Tolerance: both sides compute in fp32 and differ only in the order of their sums (sgemm over
// [new, past + new] scores instead of [seq, seq], a [1, d] GEMM instead of [T, d]), so the
// difference is a few units of fp32 rounding of the logits' scale (~1e-7 relative); 2e-5 absolute
// on logits of magnitude ~1 leaves room and would still catch a wrong position or mask (1e-2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "assert_ok.h"
#include "model/normformer_model.h"
#include "test_util.h"

namespace nf::model {
namespace {

using ::nf::testing::MakeIds;

constexpr int64_t kSeq = 12;
constexpr double kTolerance = 2e-5;

ModelConfig SmallConfig(ModelConfig::Positions positions, bool heads_after) {
  ModelConfig c;
  c.set_num_layers(2);
  c.set_d_model(16);
  c.set_num_heads(4);
  c.set_ffn_dim(32);
  c.set_vocab_size(37);
  c.set_max_seq_len(16);
  c.set_positions(positions);
  c.set_dropout(0.1f);
  c.set_attention_dropout(0.1f);
  NormFormerConfig* nf = c.mutable_normformer();
  nf->set_scale_attn(true);
  nf->set_scale_heads(true);
  nf->set_head_scale_placement(heads_after ? NormFormerConfig::AFTER_OUT_PROJ
                                           : NormFormerConfig::BEFORE_OUT_PROJ);
  nf->set_scale_fc(true);
  nf->set_scale_resids(true);
  return c;
}

std::vector<int32_t> RandomIds(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>(rng() % 37));
  return ids;
}

std::unique_ptr<NormFormerModel> Make(const ModelConfig& config, int64_t batch, int64_t seq) {
  auto model = NormFormerModel::Create(config, {.micro_batch = batch, .seq_len = seq, .seed = 3});
  NF_EXPECT_OK(model);
  return *std::move(model);
}

// 20 plain SGD steps on next-token prediction of random sequences, with dropout on.
void Train(NormFormerModel& model, int64_t batch) {
  for (int step = 0; step < 20; ++step) {
    const std::vector<int32_t> ids = RandomIds(batch * (kSeq + 1), 100 + step);
    std::vector<int32_t> inputs, targets;
    for (int64_t b = 0; b < batch; ++b) {
      inputs.insert(inputs.end(), ids.begin() + b * (kSeq + 1),
                    ids.begin() + b * (kSeq + 1) + kSeq);
      targets.insert(targets.end(), ids.begin() + b * (kSeq + 1) + 1,
                     ids.begin() + (b + 1) * (kSeq + 1));
    }
    NF_ASSERT_OK(model.params().ZeroGrads());
    NF_ASSERT_OK(model
                     .Forward(MakeIds({batch, kSeq}, inputs), MakeIds({batch, kSeq}, targets),
                              step * batch, /*train=*/true)
                     .status());
    NF_ASSERT_OK(model.Backward(1.0f / static_cast<float>(batch * kSeq)));
    NF_ASSERT_OK(ops::Axpy(-0.5f, model.params().grads(), model.params().params()));
  }
}

// The real vocabulary's logits of `rows` rows from row `first` of the model's last logits.
std::vector<float> LogitRows(const NormFormerModel& model, int64_t first, int64_t rows) {
  const Tensor& logits = model.logits();
  std::vector<float> all = *ToFloatVector(*logits.Slice(first, rows));
  std::vector<float> real;
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = all.begin() + r * logits.dim(1);
    real.insert(real.end(), row, row + model.config().vocab_size());
  }
  return real;
}

struct Case {
  ModelConfig::Positions positions;
  bool heads_after;
  int64_t batch, chunk;  // samples decoded together, tokens per cached forward
};

class KvCacheTest : public ::testing::TestWithParam<Case> {};

INSTANTIATE_TEST_SUITE_P(Layouts, KvCacheTest,
                         ::testing::Values(Case{ModelConfig::SINUSOIDAL, false, 1, 1},
                                           Case{ModelConfig::LEARNED, true, 1, 1},
                                           Case{ModelConfig::SINUSOIDAL, true, 2, 3},
                                           Case{ModelConfig::LEARNED, false, 2, 4}));

TEST_P(KvCacheTest, EveryStepsLogitsEqualTheFullForward) {
  const Case c = GetParam();
  const ModelConfig config = SmallConfig(c.positions, c.heads_after);
  auto full = Make(config, c.batch, kSeq);
  Train(*full, c.batch);
  const std::vector<int32_t> ids = RandomIds(c.batch * kSeq, 7);
  NF_ASSERT_OK(full->Forward(MakeIds({c.batch, kSeq}, ids),
                             MakeIds({c.batch, kSeq}, std::vector<int32_t>(ids.size(), -1)), 0,
                             /*train=*/false)
                   .status());
  const std::vector<float> expected = LogitRows(*full, 0, c.batch * kSeq);

  auto cached = Make(config, c.batch, c.chunk);
  NF_ASSERT_OK(ops::Copy(full->params().params(), cached->params().params()));
  const int64_t vocab = config.vocab_size();
  double worst = 0.0;
  // Twice: the second pass reuses the emptied cache.
  for (int pass = 0; pass < 2; ++pass) {
    NF_ASSERT_OK(cached->StartKvCache(kSeq));
    for (int64_t t = 0; t < kSeq; t += c.chunk) {
      std::vector<int32_t> chunk;
      for (int64_t b = 0; b < c.batch; ++b) {
        for (int64_t i = 0; i < c.chunk; ++i) chunk.push_back(ids[b * kSeq + t + i]);
      }
      const Tensor chunk_ids = MakeIds({c.batch, c.chunk}, chunk);
      NF_ASSERT_OK(cached->ForwardCached(&chunk_ids, nullptr).status());
      EXPECT_EQ(cached->cached_tokens(), t + c.chunk);
      const std::vector<float> got = LogitRows(*cached, 0, c.batch * c.chunk);
      for (int64_t b = 0; b < c.batch; ++b) {
        for (int64_t i = 0; i < c.chunk; ++i) {
          for (int64_t v = 0; v < vocab; ++v) {
            const double diff = std::abs(got[(b * c.chunk + i) * vocab + v] -
                                         expected[(b * kSeq + t + i) * vocab + v]);
            worst = std::max(worst, diff);
            ASSERT_LE(diff, kTolerance) << "sample " << b << " position " << t + i << " id " << v;
          }
        }
      }
    }
  }
  std::cout << "max |cached - full| logit difference: " << worst << "\n";
  // The scales moved: the test is about a trained model, not one at its initial values.
  for (const Param* scale :
       {&full->model_params().layers[0].head_scale, &full->model_params().layers[1].resid_scale}) {
    const std::vector<float> values = *ToFloatVector(scale->value);
    EXPECT_GT(std::abs(values[0] - 1.0f), 1e-4f);
  }
}

TEST(KvCacheErrorsTest, RefusesAForwardBeyondTheCacheAndWithoutOne) {
  const ModelConfig config = SmallConfig(ModelConfig::SINUSOIDAL, false);
  auto model = Make(config, 1, 2);
  const Tensor ids = MakeIds({1, 2}, {1, 2});
  EXPECT_EQ(model->ForwardCached(&ids, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(model->StartKvCache(17).code(), absl::StatusCode::kInvalidArgument);
  NF_ASSERT_OK(model->StartKvCache(3));
  NF_ASSERT_OK(model->ForwardCached(&ids, nullptr).status());
  EXPECT_EQ(model->ForwardCached(&ids, nullptr).status().code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace nf::model
