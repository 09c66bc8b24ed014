#include "model/normformer_params.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace nf::model {
namespace {

// Rows of the spec list for a weight/bias pair of a fairseq Linear [out, in].
struct LinearInit {
  Sharding weight_sharding, bias_sharding;
  InitKind weight_init;
  float weight_scale;
  InitKind bias_init;
  float bias_scale;
};

void AddLinear(std::vector<ParamSpec>& specs, const std::string& prefix, int64_t out, int64_t in,
               const LinearInit& init) {
  specs.push_back({.name = prefix + ".weight",
                   .global_shape = {out, in},
                   .sharding = init.weight_sharding,
                   .weight_decay = true,
                   .init = init.weight_init,
                   .init_scale = init.weight_scale});
  specs.push_back({.name = prefix + ".bias",
                   .global_shape = {out},
                   .sharding = init.bias_sharding,
                   .weight_decay = false,
                   .init = init.bias_init,
                   .init_scale = init.bias_scale});
}

// Linear layers that read the same input, their weights adjacent in the flat buffers and then
// their biases, so that one GEMM computes them all (BindAdjacent): q, k and v.
void AddProjections(std::vector<ParamSpec>& specs, const std::vector<std::string>& prefixes,
                    int64_t out, int64_t in, const LinearInit& init) {
  std::vector<ParamSpec> biases;
  for (const std::string& prefix : prefixes) {
    AddLinear(specs, prefix, out, in, init);
    biases.push_back(specs.back());
    specs.pop_back();
    // Each weight after the first, and each bias after the first, continues the previous.
    if (biases.size() > 1) specs.back().follows_previous = true;
  }
  for (size_t i = 1; i < biases.size(); ++i) biases[i].follows_previous = true;
  specs.insert(specs.end(), biases.begin(), biases.end());
}

void AddLayerNorm(std::vector<ParamSpec>& specs, const std::string& prefix, int64_t dim,
                  Sharding sharding) {
  specs.push_back({.name = prefix + ".weight",
                   .global_shape = {dim},
                   .sharding = sharding,
                   .init = InitKind::kOnes});
  specs.push_back({.name = prefix + ".bias",
                   .global_shape = {dim},
                   .sharding = sharding,
                   .init = InitKind::kZeros});
}

Param Bind(const ParamTable& table, const std::string& name) {
  if (!table.Contains(name)) return {};
  const ParamTable::Entry& e = table.Get(name);
  return {e.value, e.grad};
}

// One Param over the parameters `names`, which lie next to each other in the flat buffers in
// that order, viewed as `shape` (their elements in all): the q, k and v projections' weights as
// one [3 d_local, d] matrix. Aborts when they are not adjacent (the specs' order is a bug).
Param BindAdjacent(const ParamTable& table, const std::vector<std::string>& names, Shape shape) {
  const int64_t first = table.Get(names.front()).offset;
  int64_t next = first;
  for (const std::string& name : names) {
    const ParamTable::Entry& e = table.Get(name);
    if (e.offset != next) {
      std::fprintf(stderr, "normformer: internal error: %s is not adjacent to %s\n", name.c_str(),
                   names.front().c_str());
      std::abort();
    }
    next += NumElements(e.local_shape);
  }
  absl::StatusOr<Tensor> value = table.params().View(first, shape);
  absl::StatusOr<Tensor> grad =
      table.has_gradients() ? table.grads().View(first, shape) : absl::StatusOr<Tensor>(Tensor());
  if (!value.ok() || !grad.ok() || next - first != NumElements(shape)) {
    std::fprintf(stderr, "normformer: internal error: cannot view %s... as one parameter\n",
                 names.front().c_str());
    std::abort();
  }
  return {*std::move(value), *std::move(grad)};
}

// RoBERTa (fairseq's init_bert_params) draws every Linear weight and embedding from N(0, 0.02)
// and starts every Linear bias at 0.
constexpr float kBertInitStd = 0.02f;
constexpr LinearInit kBertLinear{Sharding::kReplicated, Sharding::kReplicated, InitKind::kNormal,
                                 kBertInitStd,          InitKind::kZeros,      0.0f};

bool IsMaskedLm(const ModelConfig& config) { return config.objective() == ModelConfig::MASKED_LM; }

// `init` with the masked LM's initialisation, sharded as `init` is.
LinearInit ForObjective(const ModelConfig& config, LinearInit init) {
  if (!IsMaskedLm(config)) return init;
  LinearInit bert = kBertLinear;
  bert.weight_sharding = init.weight_sharding;
  bert.bias_sharding = init.bias_sharding;
  return bert;
}

// The end of `placement`'s layer range, -1 (all) resolved.
int LayerEnd(const PipelineStagePlacement& placement, const ModelConfig& config) {
  return placement.layer_end == -1 ? config.num_layers() : placement.layer_end;
}

// The token embedding (also the tied head's copy on a last stage) and learned positions.
void AddEmbedding(std::vector<ParamSpec>& specs, const ModelConfig& config, int64_t padded_vocab,
                  bool positions) {
  // fairseq: embeddings N(0, d^-1/2); RoBERTa's init_bert_params: N(0, 0.02).
  const float embed_std =
      IsMaskedLm(config)
          ? kBertInitStd
          : static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.d_model())));
  specs.push_back({.name = "decoder.embed_tokens.weight",
                   .global_shape = {padded_vocab, config.d_model()},
                   .sharding = Sharding::kSplitRows,
                   .weight_decay = true,
                   .init = InitKind::kNormal,
                   .init_scale = embed_std});
  if (positions && config.positions() == ModelConfig::LEARNED) {
    // Row p is position p; a sequence uses rows first_position .. first_position + seq - 1,
    // so with fairseq's first_position 2 the table has fairseq's shape.
    specs.push_back(
        {.name = "decoder.embed_positions.weight",
         .global_shape = {config.max_seq_len() + config.first_position(), config.d_model()},
         .weight_decay = true,
         .init = InitKind::kNormal,
         .init_scale = embed_std});
  }
}

void AddLayer(std::vector<ParamSpec>& specs, const ModelConfig& config, int layer) {
  const int64_t d = config.d_model(), ffn = config.ffn_dim();
  const NormFormerConfig& nf = config.normformer();
  // fairseq: PyTorch's nn.Linear default U(+-1/sqrt(fan_in)) for fc1/fc2 weights and biases
  // and q/k/v biases; xavier_uniform with gain 1/sqrt(2) for q/k/v weights and gain 1 for
  // out_proj, whose bias starts at 0.
  const float inv_sqrt_d = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  const float inv_sqrt_ffn = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ffn)));
  const LinearInit qkv{Sharding::kSplitRows,     Sharding::kSplitRows,
                       InitKind::kXavierUniform, static_cast<float>(1.0 / std::sqrt(2.0)),
                       InitKind::kUniform,       inv_sqrt_d};
  const std::string p = LayerPrefix(layer);
  AddLayerNorm(specs, p + ".self_attn_layer_norm", d, Sharding::kReplicated);
  AddProjections(specs, {p + ".self_attn.q_proj", p + ".self_attn.k_proj", p + ".self_attn.v_proj"},
                 d, d, ForObjective(config, qkv));
  AddLinear(specs, p + ".self_attn.out_proj", d, d,
            ForObjective(config, {Sharding::kSplitCols, Sharding::kReplicated,
                                  InitKind::kXavierUniform, 1.0f, InitKind::kZeros, 0.0f}));
  if (nf.scale_heads()) {
    // Before the output projection each head's scale lives with its head; after it the
    // scale acts on the all-reduced output and is replicated.
    const bool before = nf.head_scale_placement() == NormFormerConfig::BEFORE_OUT_PROJ;
    specs.push_back({.name = p + ".c_attn",
                     .global_shape = {config.num_heads()},
                     .sharding = before ? Sharding::kSplitRows : Sharding::kReplicated,
                     .init = InitKind::kOnes});
  }
  if (nf.scale_attn()) AddLayerNorm(specs, p + ".attn_ln", d, Sharding::kReplicated);
  AddLayerNorm(specs, p + ".final_layer_norm", d, Sharding::kReplicated);
  AddLinear(specs, p + ".fc1", ffn, d,
            ForObjective(config, {Sharding::kSplitRows, Sharding::kSplitRows, InitKind::kUniform,
                                  inv_sqrt_d, InitKind::kUniform, inv_sqrt_d}));
  if (nf.scale_fc()) AddLayerNorm(specs, p + ".ffn_layernorm", ffn, Sharding::kSplitRows);
  AddLinear(specs, p + ".fc2", d, ffn,
            ForObjective(config, {Sharding::kSplitCols, Sharding::kReplicated, InitKind::kUniform,
                                  inv_sqrt_ffn, InitKind::kUniform, inv_sqrt_ffn}));
  if (nf.scale_resids()) {
    specs.push_back({.name = p + ".w_resid", .global_shape = {d}, .init = InitKind::kOnes});
  }
}

// The final LayerNorm, the masked LM's transform (RoBERTa's lm_head: dense, activation,
// LayerNorm) and the untied projection; the tied projection is the embedding (AddEmbedding). The
// masked LM's output bias [padded_vocab] is split with the vocabulary, as the projection is.
void AddHead(std::vector<ParamSpec>& specs, const ModelConfig& config, int64_t padded_vocab) {
  const int64_t d = config.d_model();
  AddLayerNorm(specs, "decoder.layer_norm", d, Sharding::kReplicated);
  if (IsMaskedLm(config)) {
    AddLinear(specs, "decoder.lm_head.dense", d, d, kBertLinear);
    AddLayerNorm(specs, "decoder.lm_head.layer_norm", d, Sharding::kReplicated);
    specs.push_back({.name = "decoder.lm_head.bias",
                     .global_shape = {padded_vocab},
                     .sharding = Sharding::kSplitRows,
                     .init = InitKind::kZeros});
  }
  if (!config.tie_embeddings()) {
    specs.push_back(
        {.name = "decoder.output_projection.weight",
         .global_shape = {padded_vocab, d},
         .sharding = Sharding::kSplitRows,
         .weight_decay = true,
         .init = InitKind::kNormal,
         .init_scale = IsMaskedLm(config)
                           ? kBertInitStd
                           : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))});
  }
}

}  // namespace

std::string LayerPrefix(int layer) { return absl::StrCat("decoder.layers.", layer); }

int HeadBlock(int num_layers) { return num_layers; }

int BlockOf(absl::string_view param_name, int num_layers) {
  constexpr absl::string_view kLayers = "decoder.layers.";
  if (absl::StartsWith(param_name, kLayers)) {
    const absl::string_view rest = param_name.substr(kLayers.size());
    int layer = 0;
    if (absl::SimpleAtoi(rest.substr(0, rest.find('.')), &layer)) return layer;
  }
  if (absl::StartsWith(param_name, "decoder.embed_")) return kEmbeddingBlock;
  return HeadBlock(num_layers);
}

std::string BlockName(int block, int num_layers) {
  if (block == kEmbeddingBlock) return "embedding";
  if (block == HeadBlock(num_layers)) return "head";
  return absl::StrCat(block);
}

absl::StatusOr<PipelineStagePlacement> ResolvePlacement(const PipelineStagePlacement& placement,
                                                        int num_layers) {
  PipelineStagePlacement p = placement;
  if (p.layer_end == -1) p.layer_end = num_layers;
  const std::string where = absl::StrCat("pipeline stage ", p.stage, " of ", p.num_stages);
  if (p.num_stages < 1 || p.stage < 0 || p.stage >= p.num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the stage must be in [0, num_stages) and num_stages >= 1"));
  }
  if (p.layer_begin < 0 || p.layer_end > num_layers || p.layer_begin >= p.layer_end) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": layer range [", p.layer_begin, ", ", p.layer_end,
        ") must be a non-empty range within the model's layers [0, ", num_layers, ")"));
  }
  if (p.first() != (p.layer_begin == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": layer range [", p.layer_begin, ", ", p.layer_end,
        ") must start at layer 0 exactly when the stage is the first (it holds the embedding)"));
  }
  if (p.last() != (p.layer_end == num_layers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": layer range [", p.layer_begin, ", ", p.layer_end, ") must end at layer ",
        num_layers, " exactly when the stage is the last (it holds the head and the loss)"));
  }
  return p;
}

std::vector<ParamSpec> NormFormerParamSpecs(const ModelConfig& config, int64_t padded_vocab,
                                            const PipelineStagePlacement& placement) {
  std::vector<ParamSpec> specs;
  if (placement.first()) {
    AddEmbedding(specs, config, padded_vocab, /*positions=*/true);
  } else if (placement.last() && config.tie_embeddings()) {
    AddEmbedding(specs, config, padded_vocab, /*positions=*/false);  // the head's copy
  }
  for (int layer = placement.layer_begin; layer < LayerEnd(placement, config); ++layer) {
    AddLayer(specs, config, layer);
  }
  if (placement.last()) AddHead(specs, config, padded_vocab);
  return specs;
}

std::vector<std::string> EmbeddingGroupParams(const ModelConfig& config,
                                              const PipelineStagePlacement& placement) {
  const bool holds_copy = placement.first() || placement.last();
  if (!config.tie_embeddings() || placement.num_stages == 1 || !holds_copy) return {};
  return {"decoder.embed_tokens.weight"};
}

ModelParams BindModelParams(const ParamTable& table, const ModelConfig& config,
                            const PipelineStagePlacement& placement) {
  ModelParams m;
  m.embed_tokens = Bind(table, "decoder.embed_tokens.weight");
  m.embed_positions = Bind(table, "decoder.embed_positions.weight");
  m.first_layer = placement.layer_begin;
  for (int layer = placement.layer_begin; layer < LayerEnd(placement, config); ++layer) {
    const std::string p = LayerPrefix(layer);
    LayerParams l;
    l.attn_norm_weight = Bind(table, p + ".self_attn_layer_norm.weight");
    l.attn_norm_bias = Bind(table, p + ".self_attn_layer_norm.bias");
    const Shape& q_shape = table.Get(p + ".self_attn.q_proj.weight").local_shape;  // [d_l, d]
    const std::string q = p + ".self_attn.q_proj", k = p + ".self_attn.k_proj",
                      v = p + ".self_attn.v_proj";
    l.qkv_weight = BindAdjacent(table, {q + ".weight", k + ".weight", v + ".weight"},
                                {3 * q_shape[0], q_shape[1]});
    l.qkv_bias = BindAdjacent(table, {q + ".bias", k + ".bias", v + ".bias"}, {3 * q_shape[0]});
    l.out_weight = Bind(table, p + ".self_attn.out_proj.weight");
    l.out_bias = Bind(table, p + ".self_attn.out_proj.bias");
    l.head_scale = Bind(table, p + ".c_attn");
    l.post_attn_norm_weight = Bind(table, p + ".attn_ln.weight");
    l.post_attn_norm_bias = Bind(table, p + ".attn_ln.bias");
    l.ffn_norm_weight = Bind(table, p + ".final_layer_norm.weight");
    l.ffn_norm_bias = Bind(table, p + ".final_layer_norm.bias");
    l.fc1_weight = Bind(table, p + ".fc1.weight");
    l.fc1_bias = Bind(table, p + ".fc1.bias");
    l.mid_ffn_norm_weight = Bind(table, p + ".ffn_layernorm.weight");
    l.mid_ffn_norm_bias = Bind(table, p + ".ffn_layernorm.bias");
    l.fc2_weight = Bind(table, p + ".fc2.weight");
    l.fc2_bias = Bind(table, p + ".fc2.bias");
    l.resid_scale = Bind(table, p + ".w_resid");
    m.layers.push_back(std::move(l));
  }
  m.final_norm_weight = Bind(table, "decoder.layer_norm.weight");
  m.final_norm_bias = Bind(table, "decoder.layer_norm.bias");
  m.output_projection = Bind(table, "decoder.output_projection.weight");
  m.lm_head_dense_weight = Bind(table, "decoder.lm_head.dense.weight");
  m.lm_head_dense_bias = Bind(table, "decoder.lm_head.dense.bias");
  m.lm_head_norm_weight = Bind(table, "decoder.lm_head.layer_norm.weight");
  m.lm_head_norm_bias = Bind(table, "decoder.lm_head.layer_norm.bias");
  m.lm_head_bias = Bind(table, "decoder.lm_head.bias");
  return m;
}

}  // namespace nf::model
