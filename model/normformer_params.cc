#include "model/normformer_params.h"

#include <cmath>

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

std::string LayerPrefix(int layer) { return absl::StrCat("decoder.layers.", layer); }

}  // namespace

std::vector<ParamSpec> NormFormerParamSpecs(const ModelConfig& config, int64_t padded_vocab) {
  const int64_t d = config.d_model(), ffn = config.ffn_dim();
  const NormFormerConfig& nf = config.normformer();
  // fairseq: embeddings N(0, d^-1/2); PyTorch's nn.Linear default U(+-1/sqrt(fan_in)) for
  // fc1/fc2 weights and biases and q/k/v biases; xavier_uniform with gain 1/sqrt(2) for
  // q/k/v weights and gain 1 for out_proj, whose bias starts at 0.
  const float embed_std = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  const float inv_sqrt_d = embed_std;
  const float inv_sqrt_ffn = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ffn)));

  std::vector<ParamSpec> specs;
  specs.push_back({.name = "decoder.embed_tokens.weight",
                   .global_shape = {padded_vocab, d},
                   .sharding = Sharding::kSplitRows,
                   .weight_decay = true,
                   .init = InitKind::kNormal,
                   .init_scale = embed_std});
  if (config.positions() == ModelConfig::LEARNED) {
    specs.push_back({.name = "decoder.embed_positions.weight",
                     .global_shape = {config.max_seq_len(), d},
                     .weight_decay = true,
                     .init = InitKind::kNormal,
                     .init_scale = embed_std});
  }
  const LinearInit qkv{Sharding::kSplitRows,     Sharding::kSplitRows,
                       InitKind::kXavierUniform, static_cast<float>(1.0 / std::sqrt(2.0)),
                       InitKind::kUniform,       inv_sqrt_d};
  for (int layer = 0; layer < config.num_layers(); ++layer) {
    const std::string p = LayerPrefix(layer);
    AddLayerNorm(specs, p + ".self_attn_layer_norm", d, Sharding::kReplicated);
    AddLinear(specs, p + ".self_attn.q_proj", d, d, qkv);
    AddLinear(specs, p + ".self_attn.k_proj", d, d, qkv);
    AddLinear(specs, p + ".self_attn.v_proj", d, d, qkv);
    AddLinear(specs, p + ".self_attn.out_proj", d, d,
              {Sharding::kSplitCols, Sharding::kReplicated, InitKind::kXavierUniform, 1.0f,
               InitKind::kZeros, 0.0f});
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
              {Sharding::kSplitRows, Sharding::kSplitRows, InitKind::kUniform, inv_sqrt_d,
               InitKind::kUniform, inv_sqrt_d});
    if (nf.scale_fc()) AddLayerNorm(specs, p + ".ffn_layernorm", ffn, Sharding::kSplitRows);
    AddLinear(specs, p + ".fc2", d, ffn,
              {Sharding::kSplitCols, Sharding::kReplicated, InitKind::kUniform, inv_sqrt_ffn,
               InitKind::kUniform, inv_sqrt_ffn});
    if (nf.scale_resids()) {
      specs.push_back({.name = p + ".w_resid", .global_shape = {d}, .init = InitKind::kOnes});
    }
  }
  AddLayerNorm(specs, "decoder.layer_norm", d, Sharding::kReplicated);
  if (!config.tie_embeddings()) {
    specs.push_back({.name = "decoder.output_projection.weight",
                     .global_shape = {padded_vocab, d},
                     .sharding = Sharding::kSplitRows,
                     .weight_decay = true,
                     .init = InitKind::kNormal,
                     .init_scale = embed_std});
  }
  return specs;
}

ModelParams BindModelParams(const ParamTable& table, const ModelConfig& config) {
  ModelParams m;
  m.embed_tokens = Bind(table, "decoder.embed_tokens.weight");
  m.embed_positions = Bind(table, "decoder.embed_positions.weight");
  for (int layer = 0; layer < config.num_layers(); ++layer) {
    const std::string p = LayerPrefix(layer);
    LayerParams l;
    l.attn_norm_weight = Bind(table, p + ".self_attn_layer_norm.weight");
    l.attn_norm_bias = Bind(table, p + ".self_attn_layer_norm.bias");
    l.q_weight = Bind(table, p + ".self_attn.q_proj.weight");
    l.q_bias = Bind(table, p + ".self_attn.q_proj.bias");
    l.k_weight = Bind(table, p + ".self_attn.k_proj.weight");
    l.k_bias = Bind(table, p + ".self_attn.k_proj.bias");
    l.v_weight = Bind(table, p + ".self_attn.v_proj.weight");
    l.v_bias = Bind(table, p + ".self_attn.v_proj.bias");
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
  return m;
}

}  // namespace nf::model
