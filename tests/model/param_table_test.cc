// The parameter registry: fairseq names, decay flags and tensor-parallel sharding of every
// NormFormer parameter, fairseq's initialisation, and its independence from the layout.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "model/aligned_layout.h"
#include "model/normformer_params.h"
#include "model/param_table.h"
#include "model/vocab.h"
#include "test_util.h"

namespace nf::model {
namespace {

using ::nf::testing::ToDoubles;

ModelConfig Config(bool normformer, bool after = false) {
  ModelConfig c;
  c.set_num_layers(2);
  c.set_d_model(16);
  c.set_num_heads(4);
  c.set_ffn_dim(32);
  c.set_vocab_size(300);
  c.set_max_seq_len(8);
  NormFormerConfig* nf = c.mutable_normformer();
  nf->set_scale_attn(normformer);
  nf->set_scale_heads(normformer);
  nf->set_scale_fc(normformer);
  nf->set_scale_resids(normformer);
  nf->set_head_scale_placement(after ? NormFormerConfig::AFTER_OUT_PROJ
                                     : NormFormerConfig::BEFORE_OUT_PROJ);
  return c;
}

const ParamSpec* Find(const std::vector<ParamSpec>& specs, const std::string& name) {
  for (const ParamSpec& s : specs) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

TEST(VocabTest, PaddedToMultiplesOf128TimesTensorParallel) {
  EXPECT_EQ(PaddedVocabSize(50257, 1), 50304);
  EXPECT_EQ(PaddedVocabSize(50257, 8), 51200);
  EXPECT_EQ(PaddedVocabSize(512, 4), 512);
  EXPECT_EQ(PaddedVocabSize(1, 2), 256);
}

TEST(NormFormerParamSpecsTest, NamesDecayAndShardingFollowFairseqAndMegatron) {
  const std::vector<ParamSpec> specs = NormFormerParamSpecs(Config(true), 384);
  struct Expected {
    std::string name;
    Shape shape;
    Sharding sharding;
    bool decay;
  };
  const std::string l = "decoder.layers.1.";
  for (const Expected& e : std::vector<Expected>{
           {"decoder.embed_tokens.weight", {384, 16}, Sharding::kSplitRows, true},
           {l + "self_attn_layer_norm.weight", {16}, Sharding::kReplicated, false},
           {l + "self_attn.q_proj.weight", {16, 16}, Sharding::kSplitRows, true},
           {l + "self_attn.k_proj.bias", {16}, Sharding::kSplitRows, false},
           {l + "self_attn.out_proj.weight", {16, 16}, Sharding::kSplitCols, true},
           {l + "self_attn.out_proj.bias", {16}, Sharding::kReplicated, false},
           {l + "c_attn", {4}, Sharding::kSplitRows, false},  // heads shard with their scales
           {l + "attn_ln.weight", {16}, Sharding::kReplicated, false},
           {l + "final_layer_norm.bias", {16}, Sharding::kReplicated, false},
           {l + "fc1.weight", {32, 16}, Sharding::kSplitRows, true},
           {l + "fc1.bias", {32}, Sharding::kSplitRows, false},
           {l + "ffn_layernorm.weight", {32}, Sharding::kSplitRows, false},  // over ffn: split
           {l + "fc2.weight", {16, 32}, Sharding::kSplitCols, true},
           {l + "fc2.bias", {16}, Sharding::kReplicated, false},
           {l + "w_resid", {16}, Sharding::kReplicated, false},
           {"decoder.layer_norm.weight", {16}, Sharding::kReplicated, false},
       }) {
    const ParamSpec* spec = Find(specs, e.name);
    ASSERT_NE(spec, nullptr) << e.name;
    EXPECT_EQ(spec->global_shape, e.shape) << e.name;
    EXPECT_EQ(spec->sharding, e.sharding) << e.name;
    EXPECT_EQ(spec->weight_decay, e.decay) << e.name;
  }
  // fairseq's placement scales the all-reduced projection output: replicated.
  EXPECT_EQ(Find(NormFormerParamSpecs(Config(true, true), 384), l + "c_attn")->sharding,
            Sharding::kReplicated);
}

TEST(NormFormerParamSpecsTest, SwitchesAddExactlyTheirParameters) {
  const std::vector<ParamSpec> baseline = NormFormerParamSpecs(Config(false), 384);
  const std::vector<ParamSpec> normformer = NormFormerParamSpecs(Config(true), 384);
  for (const std::string& suffix :
       std::vector<std::string>{"c_attn", "attn_ln.weight", "ffn_layernorm.bias", "w_resid"}) {
    EXPECT_EQ(Find(baseline, "decoder.layers.0." + suffix), nullptr) << suffix;
    EXPECT_NE(Find(normformer, "decoder.layers.0." + suffix), nullptr) << suffix;
  }
  // Per layer: heads (c_attn) + 2d (attn_ln) + 2 ffn (ffn_layernorm) + d (w_resid).
  auto count = [](const std::vector<ParamSpec>& specs) {
    int64_t n = 0;
    for (const ParamSpec& s : specs) n += NumElements(s.global_shape);
    return n;
  };
  EXPECT_EQ(count(normformer) - count(baseline), 2 * (4 + 2 * 16 + 2 * 32 + 16));
  ModelConfig untied = Config(false);
  untied.set_tie_embeddings(false);
  untied.set_positions(ModelConfig::LEARNED);
  const std::vector<ParamSpec> more = NormFormerParamSpecs(untied, 384);
  EXPECT_NE(Find(more, "decoder.output_projection.weight"), nullptr);
  EXPECT_NE(Find(more, "decoder.embed_positions.weight"), nullptr);
  EXPECT_EQ(Find(baseline, "decoder.output_projection.weight"), nullptr);
  EXPECT_EQ(Find(baseline, "decoder.embed_positions.weight"), nullptr);
}

// Rank r of tp ranks holds rows [r R/tp, (r+1) R/tp) or columns likewise; its initial values
// must be exactly that slice of the single-rank values.
TEST(ParamTableTest, InitialisationDoesNotDependOnTheTensorParallelLayout) {
  const std::vector<ParamSpec> specs = NormFormerParamSpecs(Config(true), 512);
  auto full = ParamTable::Create(specs, DType::kF32, 0, 1);
  NF_ASSERT_OK(full);
  NF_ASSERT_OK(full->Initialize(7));
  const int tp = 2;
  for (int rank = 0; rank < tp; ++rank) {
    auto shard = ParamTable::Create(specs, DType::kF32, rank, tp);
    NF_ASSERT_OK(shard);
    NF_ASSERT_OK(shard->Initialize(7));
    for (const ParamTable::Entry& e : shard->entries()) {
      const std::vector<float> local = *ToFloatVector(e.value);
      const std::vector<float> global = *ToFloatVector(full->Get(e.spec.name).value);
      const Shape& g = e.spec.global_shape;
      const int64_t cols = g.size() < 2 ? 1 : g[1];
      const int64_t local_rows = e.local_shape[0];
      const int64_t local_cols = e.local_shape.size() < 2 ? 1 : e.local_shape[1];
      for (int64_t r = 0; r < local_rows; ++r) {
        for (int64_t c = 0; c < local_cols; ++c) {
          int64_t gr = r, gc = c;
          if (e.spec.sharding == Sharding::kSplitRows) gr += rank * local_rows;
          if (e.spec.sharding == Sharding::kSplitCols) gc += rank * local_cols;
          ASSERT_EQ(local[r * local_cols + c], global[gr * cols + gc])
              << e.spec.name << " rank " << rank << " (" << r << ", " << c << ")";
        }
      }
    }
  }
}

// InitialValues, which makes a model file without a table (bench/init_file.cc), draws what the
// one-rank table holds, from any element on.
TEST(ParamTableTest, InitialValuesAreTheTablesFromAnyElement) {
  const std::vector<ParamSpec> specs = NormFormerParamSpecs(Config(true), 512);
  auto full = ParamTable::Create(specs, DType::kF32, 0, 1);
  NF_ASSERT_OK(full);
  NF_ASSERT_OK(full->Initialize(7));
  for (const ParamTable::Entry& e : full->entries()) {
    const std::vector<float> table = *ToFloatVector(e.value);
    EXPECT_EQ(InitialValues(e.spec, 7, 0, e.value.numel()), table) << e.spec.name;
    const int64_t begin = e.value.numel() / 3;
    EXPECT_EQ(InitialValues(e.spec, 7, begin, e.value.numel() - begin),
              std::vector<float>(table.begin() + begin, table.end()))
        << e.spec.name;
  }
}

TEST(ParamTableTest, InitialisationFollowsFairseqDistributions) {
  ModelConfig config = Config(true);
  config.set_d_model(64);
  config.set_ffn_dim(256);
  auto table = ParamTable::Create(NormFormerParamSpecs(config, 512), DType::kF32, 0, 1);
  NF_ASSERT_OK(table);
  NF_ASSERT_OK(table->Initialize(3));
  auto values = [&](const std::string& name) { return *ToFloatVector(table->Get(name).value); };
  // Embedding N(0, 1/sqrt(64) = 0.125): 32768 draws; the sample std is within 2% (its standard
  // error is 0.125 / sqrt(2 * 32768) = 0.4%: 5 standard errors), the mean within 5 errors.
  const std::vector<float> embed = values("decoder.embed_tokens.weight");
  double sum = 0.0, squares = 0.0;
  for (float v : embed) {
    sum += v;
    squares += double(v) * v;
  }
  const double mean = sum / embed.size(), std = std::sqrt(squares / embed.size() - mean * mean);
  EXPECT_NEAR(std, 0.125, 0.125 * 0.02);
  EXPECT_NEAR(mean, 0.0, 5 * 0.125 / std::sqrt(double(embed.size())));
  // Uniform bounds: q/k/v xavier with gain 1/sqrt(2): sqrt(6 / 128) / sqrt(2); out_proj gain 1;
  // fc1 weight and bias 1/sqrt(d) = 1/8, fc2 1/sqrt(ffn) = 1/16. Each must be reached within
  // 2% (4096-16384 uniform draws: the largest falls that close to the bound with overwhelming
  // probability, 1 - 0.99^4096) and never exceeded.
  auto expect_uniform = [&](const std::string& name, double bound) {
    const std::vector<float> v = values(name);
    double largest = 0.0;
    for (float x : v) largest = std::max(largest, std::abs(double(x)));
    EXPECT_LE(largest, bound) << name;
    EXPECT_GE(largest, 0.98 * bound) << name;
  };
  const std::string l = "decoder.layers.0.";
  expect_uniform(l + "self_attn.q_proj.weight", std::sqrt(6.0 / 128) / std::sqrt(2.0));
  expect_uniform(l + "self_attn.out_proj.weight", std::sqrt(6.0 / 128));
  expect_uniform(l + "fc1.weight", 1.0 / 8);
  expect_uniform(l + "fc2.weight", 1.0 / 16);
  for (float v : values(l + "self_attn.out_proj.bias")) ASSERT_EQ(v, 0.0f);
  for (const std::string& name :
       {l + "c_attn", l + "w_resid", l + "attn_ln.weight", l + "ffn_layernorm.weight",
        std::string("decoder.layer_norm.weight")}) {
    for (float v : values(name)) ASSERT_EQ(v, 1.0f) << name;
  }
  for (float v : values(l + "ffn_layernorm.bias")) ASSERT_EQ(v, 0.0f);
}

TEST(ParamTableTest, SameSeedSameValuesOtherSeedOtherValues) {
  const std::vector<ParamSpec> specs = NormFormerParamSpecs(Config(true), 384);
  auto a = ParamTable::Create(specs, DType::kBF16, 0, 1);
  auto b = ParamTable::Create(specs, DType::kBF16, 0, 1);
  auto c = ParamTable::Create(specs, DType::kBF16, 0, 1);
  NF_ASSERT_OK(a->Initialize(1));
  NF_ASSERT_OK(b->Initialize(1));
  NF_ASSERT_OK(c->Initialize(2));
  const std::vector<float> va = *ToFloatVector(a->params()), vb = *ToFloatVector(b->params()),
                           vc = *ToFloatVector(c->params());
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
}

TEST(ParamTableTest, FlatBuffersViewsAndDecayRanges) {
  auto table = ParamTable::Create(NormFormerParamSpecs(Config(true), 384), DType::kF16, 0, 1);
  NF_ASSERT_OK(table);
  EXPECT_EQ(table->params().dtype(), DType::kF16);
  EXPECT_EQ(table->grads().dtype(), DType::kF32);
  // In declaration order, each at the next multiple of kParamAlignment unless it continues the
  // previous one (k and v after q), then padded to a multiple of kParamAlignment.
  int64_t end = 0, elements = 0;
  for (const ParamTable::Entry& e : table->entries()) {
    const int64_t expected = e.spec.follows_previous
                                 ? end
                                 : (end + kParamAlignment - 1) / kParamAlignment * kParamAlignment;
    EXPECT_EQ(e.offset, expected) << e.spec.name;
    EXPECT_TRUE(e.value.SharesStorageWith(table->params()));
    EXPECT_TRUE(e.grad.SharesStorageWith(table->grads()));
    end = e.offset + NumElements(e.local_shape);
    elements += NumElements(e.local_shape);
  }
  EXPECT_EQ(table->num_elements(), (end + kParamAlignment - 1) / kParamAlignment * kParamAlignment);
  EXPECT_EQ(table->num_global_elements(), elements);
  // The padding is zeros, in the parameters and the gradients.
  std::vector<bool> used(table->num_elements(), false);
  for (const ParamTable::Entry& e : table->entries()) {
    std::fill_n(used.begin() + e.offset, NumElements(e.local_shape), true);
  }
  const std::vector<double> params = ToDoubles(table->params()), grads = ToDoubles(table->grads());
  for (size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) {
      ASSERT_TRUE(params[i] == 0.0 && grads[i] == 0.0) << "padding element " << i;
    }
  }
  const std::vector<optim::ParamRange> ranges = table->DecayRanges();
  ASSERT_EQ(ranges.size(), table->entries().size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_EQ(ranges[i].offset, table->entries()[i].offset);
    EXPECT_EQ(ranges[i].weight_decay, table->entries()[i].spec.weight_decay);
  }
}

// The layer's q, k, v projection is one [3 d_local, d] matrix (and [3 d_local] bias) over the
// three fairseq parameters, whatever the tensor-parallel rank: its rows are q_proj's, then
// k_proj's, then v_proj's, for the values and the gradients alike.
TEST(ParamTableTest, FusedQkvProjectionViewsTheThreeProjections) {
  const ModelConfig config = Config(true);
  for (const int tp : {1, 2}) {
    for (int rank = 0; rank < tp; ++rank) {
      auto table = ParamTable::Create(NormFormerParamSpecs(config, 384), DType::kF32, rank, tp);
      NF_ASSERT_OK(table);
      NF_ASSERT_OK(table->Initialize(5));
      // Gradients that tell the parameters apart.
      float* grads = table->grads().data<float>();
      for (int64_t i = 0; i < table->num_elements(); ++i) grads[i] = static_cast<float>(i);
      const ModelParams params = BindModelParams(*table, config, PipelineStagePlacement{});
      ASSERT_EQ(params.layers.size(), 2u);
      const LayerParams& layer = params.layers[1];
      const int64_t rows = 16 / tp;  // d_local
      EXPECT_EQ(layer.qkv_weight.value.shape(), (Shape{3 * rows, 16}));
      EXPECT_EQ(layer.qkv_bias.value.shape(), (Shape{3 * rows}));
      int64_t weight_at = 0, bias_at = 0;
      for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
        const std::string name = std::string("decoder.layers.1.self_attn.") + proj;
        for (const auto& [fused, at, part] :
             {std::tuple{&layer.qkv_weight, &weight_at, &table->Get(name + ".weight")},
              {&layer.qkv_bias, &bias_at, &table->Get(name + ".bias")}}) {
          const int64_t n = part->value.numel();
          const std::vector<double> values = ToDoubles(part->value);
          const std::vector<double> fused_values = ToDoubles(fused->value);
          const std::vector<double> part_grads = ToDoubles(part->grad);
          const std::vector<double> fused_grads = ToDoubles(fused->grad);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(fused_values[*at + i], values[i]) << name << " tp " << tp << " rank " << rank;
            ASSERT_EQ(fused_grads[*at + i], part_grads[i]) << name;
          }
          *at += n;
        }
      }
    }
  }
}

TEST(ParamTableTest, RejectsUnevenSplitsAndDuplicateNames) {
  ModelConfig config = Config(true);
  auto uneven = ParamTable::Create(NormFormerParamSpecs(config, 384), DType::kF32, 0, 3);
  ASSERT_FALSE(uneven.ok());
  // The first split parameter: 384 embedding rows do divide by 3, 16 q_proj rows do not.
  EXPECT_NE(uneven.status().message().find("q_proj.weight"), absl::string_view::npos)
      << uneven.status();
  EXPECT_NE(uneven.status().message().find("tensor_parallel = 3"), absl::string_view::npos);
  std::vector<ParamSpec> twice = {{.name = "w", .global_shape = {2}},
                                  {.name = "w", .global_shape = {3}}};
  auto duplicate = ParamTable::Create(twice, DType::kF32, 0, 1);
  ASSERT_FALSE(duplicate.ok());
  EXPECT_NE(duplicate.status().message().find("declared twice"), absl::string_view::npos);
}

// Every parameter starts 256-byte aligned in 2-byte parameters (fp32 gradients, master weights
// and moments share its offsets), whatever the head count (odd ones make a layer's per-head
// scales an odd number of elements), tensor-parallel degree, pipeline split, data-parallel
// degree and bucket size; before kParamAlignment, every parameter after the first c_attn of 12
// heads was only 8 bytes aligned.
TEST(ParamTableTest, EveryParameterStartsAlignedInEveryLayout) {
  for (const int heads : {1, 3, 5, 12, 25, 32}) {
    ModelConfig config = Config(true);
    config.set_num_layers(4);
    config.set_num_heads(heads);
    config.set_d_model(8 * heads);
    config.set_ffn_dim(4 * 8 * heads);
    config.set_vocab_size(50257);
    for (const int tp : {1, 2, 3, 4, 5, 8}) {
      if (heads % tp != 0) continue;
      for (const auto& [pp, v] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 2}}) {
        for (const int dp : {1, 2, 3, 8}) {
          for (const int64_t bucket : {int64_t{1000}, int64_t{1} << 20}) {
            testing::ExpectAlignedLayout(config, tp, pp, v, dp, bucket);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace nf::model
