#include "checkpoint/hf_model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "checkpoint/manifest_model.h"
#include "core/json_value.h"
#include "core/status.h"
#include "model/model_config_check.h"
#include "model/normformer_params.h"
#include "model/vocab.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;
using model::ModelConfig;
using model::NormFormerConfig;

// The transformers version the exported files were checked against (tests/checkpoint).
constexpr char kTransformersVersion[] = "5.25.0";

std::string Refusal(absl::string_view field, absl::string_view why) {
  return absl::StrCat("GPT-2 cannot express this model: ", field, " ", why,
                      " (export it with --model-type normformer)");
}

// The shortest decimal text that reads back as the same float (1e-05, 0.1): what Python's
// json and float() give back exactly.
std::string FloatText(float value) {
  for (int digits = 6; digits < 9; ++digits) {
    const std::string text = absl::StrFormat("%.*g", digits, value);
    if (std::strtof(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.9g", value);
}

std::string Bool(bool value) { return value ? "true" : "false"; }

std::string TokenId(std::optional<int32_t> id) { return id ? absl::StrCat(*id) : "null"; }

absl::string_view TorchDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    default:
      return "float32";
  }
}

absl::string_view ActivationName(ModelConfig::Activation activation, HfModelType type) {
  switch (activation) {
    case ModelConfig::GELU_TANH:
      return type == HfModelType::kGpt2 ? "gelu_new" : "gelu_tanh";
    case ModelConfig::RELU_SQUARED:
      return "relu_squared";
    default:
      return "gelu";
  }
}

// config.json as key/value lines in the written order; values are JSON text.
std::string JsonObject(const std::vector<std::pair<std::string, std::string>>& members) {
  std::vector<std::string> lines;
  for (const auto& [key, value] : members)
    lines.push_back(absl::StrCat("  \"", key, "\": ", value));
  return absl::StrCat("{\n", absl::StrJoin(lines, ",\n"), "\n}\n");
}

std::string Quoted(absl::string_view text) { return JsonQuoted(text); }

bool IsMaskedLm(const ModelConfig& model) { return model.objective() == ModelConfig::MASKED_LM; }

std::vector<std::pair<std::string, std::string>> NormFormerMembers(const ModelConfig& model) {
  const NormFormerConfig& nf = model.normformer();
  // The head class: a causal LM's for AutoModelForCausalLM, a masked LM's (RoBERTa's head) for
  // AutoModelForMaskedLM; AutoModel is the layers either way.
  const std::string head = IsMaskedLm(model) ? "MaskedLM" : "CausalLM";
  std::vector<std::pair<std::string, std::string>> members = {
      {"architectures", absl::StrCat("[\"NormFormerFor", head, "\"]")},
      {"auto_map", absl::StrCat("{\"AutoConfig\": \"configuration_normformer.NormFormerConfig\", "
                                "\"AutoModel\": \"modeling_normformer.NormFormerModel\", "
                                "\"AutoModelFor",
                                head, "\": \"modeling_normformer.NormFormerFor", head, "\"}")},
      {"model_type", Quoted("normformer")},
      {"objective", Quoted(IsMaskedLm(model) ? "masked_lm" : "causal_lm")},
  };
  if (IsMaskedLm(model)) {
    members.push_back({"mask_token_id", absl::StrCat(model::MaskTokenId(model))});
  }
  std::vector<std::pair<std::string, std::string>> fields = {
      {"vocab_size", absl::StrCat(model.vocab_size())},
      {"hidden_size", absl::StrCat(model.d_model())},
      {"num_hidden_layers", absl::StrCat(model.num_layers())},
      {"num_attention_heads", absl::StrCat(model.num_heads())},
      {"intermediate_size", absl::StrCat(model.ffn_dim())},
      {"max_position_embeddings", absl::StrCat(model.max_seq_len())},
      {"position_embedding_type",
       Quoted(model.positions() == ModelConfig::LEARNED ? "learned" : "sinusoidal")},
      {"first_position", absl::StrCat(model.first_position())},
      {"hidden_act", Quoted(ActivationName(model.activation(), HfModelType::kNormFormer))},
      {"layer_norm_eps", FloatText(model.layer_norm_eps())},
      {"scale_embedding", Bool(model.scale_embedding())},
      {"tie_word_embeddings", Bool(model.tie_embeddings())},
      {"scale_attn", Bool(nf.scale_attn())},
      {"scale_heads", Bool(nf.scale_heads())},
      {"head_scale_placement",
       Quoted(nf.head_scale_placement() == NormFormerConfig::AFTER_OUT_PROJ ? "after_out_proj"
                                                                            : "before_out_proj")},
      {"scale_fc", Bool(nf.scale_fc())},
      {"scale_resids", Bool(nf.scale_resids())},
      {"dropout", FloatText(model.dropout())},
      {"attention_dropout", FloatText(model.attention_dropout())},
      {"activation_dropout", FloatText(model.activation_dropout())},
  };
  members.insert(members.end(), fields.begin(), fields.end());
  return members;
}

std::vector<std::pair<std::string, std::string>> Gpt2Members(const ModelConfig& model) {
  return {
      {"architectures", "[\"GPT2LMHeadModel\"]"},
      {"model_type", Quoted("gpt2")},
      {"vocab_size", absl::StrCat(model.vocab_size())},
      {"n_embd", absl::StrCat(model.d_model())},
      {"n_layer", absl::StrCat(model.num_layers())},
      {"n_head", absl::StrCat(model.num_heads())},
      {"n_inner", absl::StrCat(model.ffn_dim())},
      {"n_positions", absl::StrCat(model.max_seq_len())},
      {"activation_function", Quoted(ActivationName(model.activation(), HfModelType::kGpt2))},
      {"layer_norm_epsilon", FloatText(model.layer_norm_eps())},
      {"embd_pdrop", FloatText(model.dropout())},
      {"resid_pdrop", FloatText(model.dropout())},
      {"attn_pdrop", FloatText(model.attention_dropout())},
      {"scale_attn_weights", "true"},
      {"scale_attn_by_inverse_layer_idx", "false"},
      {"reorder_and_upcast_attn", "false"},
      {"tie_word_embeddings", "true"},
  };
}

// ---- reading config.json ----

// The members of config.json, read by key with the key named in every refusal.
class ConfigReader {
 public:
  ConfigReader(const JsonValue& root, const fs::path& file) : root_(root), file_(file) {}

  absl::Status Error(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_.string(), ": \"", key, "\" ", what));
  }

  const JsonValue* Find(absl::string_view key) const {
    const auto it = root_.members.find(std::string(key));
    return it == root_.members.end() ? nullptr : &it->second;
  }

  // The key's value; null when it is absent and may be (`optional`), refused when it must be there.
  absl::StatusOr<const JsonValue*> Value(absl::string_view key, bool optional) const {
    const JsonValue* v = Find(key);
    if (v == nullptr && !optional) return Error(key, "is missing");
    return v;
  }

  absl::StatusOr<int32_t> Int(absl::string_view key) const {
    NF_ASSIGN_OR_RETURN(const JsonValue* v, Value(key, false));
    if (v->kind != JsonValue::Kind::kNumber || v->number != static_cast<int32_t>(v->number) ||
        v->text.find_first_of(".eE") != std::string::npos) {
      return Error(key,
                   absl::StrCat("must be an integer, not ", JsonKindName(v->kind), " ", v->text));
    }
    return static_cast<int32_t>(v->number);
  }

  // A float; `fallback` when the key is absent (nullopt: required).
  absl::StatusOr<float> Float(absl::string_view key, std::optional<float> fallback) const {
    NF_ASSIGN_OR_RETURN(const JsonValue* v, Value(key, fallback.has_value()));
    if (v == nullptr) return *fallback;
    if (v->kind != JsonValue::Kind::kNumber) {
      return Error(key, absl::StrCat("must be a number, not ", JsonKindName(v->kind)));
    }
    return static_cast<float>(v->number);
  }

  absl::StatusOr<bool> Bool(absl::string_view key, std::optional<bool> fallback) const {
    NF_ASSIGN_OR_RETURN(const JsonValue* v, Value(key, fallback.has_value()));
    if (v == nullptr) return *fallback;
    if (v->kind != JsonValue::Kind::kBool) {
      return Error(key, absl::StrCat("must be true or false, not ", JsonKindName(v->kind)));
    }
    return v->boolean;
  }

  // One of `choices`; `fallback` when absent.
  absl::StatusOr<std::string> Choice(absl::string_view key, const std::vector<std::string>& choices,
                                     std::optional<std::string> fallback) const {
    NF_ASSIGN_OR_RETURN(const JsonValue* v, Value(key, fallback.has_value()));
    if (v == nullptr) return *fallback;
    if (v->kind == JsonValue::Kind::kString) {
      for (const std::string& c : choices) {
        if (v->text == c) return c;
      }
    }
    return Error(
        key, absl::StrCat("is ",
                          v->kind == JsonValue::Kind::kString ? Quoted(v->text)
                                                              : std::string(JsonKindName(v->kind)),
                          ", not one of ", absl::StrJoin(choices, ", ")));
  }

 private:
  const JsonValue& root_;
  const fs::path& file_;
};

// "objective" (absent in exports from before masked LMs: causal_lm) and a masked LM's
// "mask_token_id", into `m`, whose vocab_size is set.
absl::Status ObjectiveFromConfig(const ConfigReader& c, ModelConfig& m) {
  NF_ASSIGN_OR_RETURN(const std::string objective,
                      c.Choice("objective", {"causal_lm", "masked_lm"}, std::string("causal_lm")));
  const JsonValue* mask = c.Find("mask_token_id");
  const bool has_mask = mask != nullptr && mask->kind != JsonValue::Kind::kNull;
  if (objective == "causal_lm") {
    if (has_mask) return c.Error("mask_token_id", "is only for objective \"masked_lm\"");
    m.set_objective(ModelConfig::CAUSAL_LM);
    return absl::OkStatus();
  }
  if (!has_mask) return c.Error("mask_token_id", "is missing (objective \"masked_lm\" needs it)");
  NF_ASSIGN_OR_RETURN(const int32_t mask_token, c.Int("mask_token_id"));
  if (mask_token < 0 || mask_token >= m.vocab_size()) {
    return c.Error(
        "mask_token_id",
        absl::StrCat("is ", mask_token, ", not an id of [0, vocab_size ", m.vocab_size(), ")"));
  }
  m.set_objective(ModelConfig::MASKED_LM);
  m.set_mask_token(mask_token);
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> NormFormerFromConfig(const ConfigReader& c) {
  ModelConfig m;
  NF_ASSIGN_OR_RETURN(const int32_t vocab, c.Int("vocab_size"));
  NF_ASSIGN_OR_RETURN(const int32_t d, c.Int("hidden_size"));
  NF_ASSIGN_OR_RETURN(const int32_t layers, c.Int("num_hidden_layers"));
  NF_ASSIGN_OR_RETURN(const int32_t heads, c.Int("num_attention_heads"));
  NF_ASSIGN_OR_RETURN(const int32_t ffn, c.Int("intermediate_size"));
  NF_ASSIGN_OR_RETURN(const int32_t positions, c.Int("max_position_embeddings"));
  NF_ASSIGN_OR_RETURN(const int32_t first_position, c.Int("first_position"));
  NF_ASSIGN_OR_RETURN(const std::string position_type,
                      c.Choice("position_embedding_type", {"learned", "sinusoidal"}, std::nullopt));
  NF_ASSIGN_OR_RETURN(const std::string act,
                      c.Choice("hidden_act", {"gelu", "gelu_tanh", "relu_squared"}, std::nullopt));
  NF_ASSIGN_OR_RETURN(
      const std::string placement,
      c.Choice("head_scale_placement", {"before_out_proj", "after_out_proj"}, std::nullopt));
  NF_ASSIGN_OR_RETURN(const float eps, c.Float("layer_norm_eps", std::nullopt));
  NF_ASSIGN_OR_RETURN(const bool scale_embedding, c.Bool("scale_embedding", std::nullopt));
  NF_ASSIGN_OR_RETURN(const bool tie, c.Bool("tie_word_embeddings", true));
  NF_ASSIGN_OR_RETURN(const bool scale_attn, c.Bool("scale_attn", std::nullopt));
  NF_ASSIGN_OR_RETURN(const bool scale_heads, c.Bool("scale_heads", std::nullopt));
  NF_ASSIGN_OR_RETURN(const bool scale_fc, c.Bool("scale_fc", std::nullopt));
  NF_ASSIGN_OR_RETURN(const bool scale_resids, c.Bool("scale_resids", std::nullopt));
  NF_ASSIGN_OR_RETURN(const float dropout, c.Float("dropout", 0.0f));
  NF_ASSIGN_OR_RETURN(const float attention_dropout, c.Float("attention_dropout", 0.0f));
  NF_ASSIGN_OR_RETURN(const float activation_dropout, c.Float("activation_dropout", 0.0f));
  m.set_vocab_size(vocab);
  m.set_d_model(d);
  m.set_num_layers(layers);
  m.set_num_heads(heads);
  m.set_ffn_dim(ffn);
  m.set_max_seq_len(positions);
  m.set_first_position(first_position);
  m.set_positions(position_type == "learned" ? ModelConfig::LEARNED : ModelConfig::SINUSOIDAL);
  m.set_activation(act == "gelu"        ? ModelConfig::GELU
                   : act == "gelu_tanh" ? ModelConfig::GELU_TANH
                                        : ModelConfig::RELU_SQUARED);
  m.set_layer_norm_eps(eps);
  m.set_scale_embedding(scale_embedding);
  m.set_tie_embeddings(tie);
  m.set_dropout(dropout);
  m.set_attention_dropout(attention_dropout);
  m.set_activation_dropout(activation_dropout);
  NormFormerConfig* nf = m.mutable_normformer();
  nf->set_scale_attn(scale_attn);
  nf->set_scale_heads(scale_heads);
  nf->set_head_scale_placement(placement == "after_out_proj" ? NormFormerConfig::AFTER_OUT_PROJ
                                                             : NormFormerConfig::BEFORE_OUT_PROJ);
  nf->set_scale_fc(scale_fc);
  nf->set_scale_resids(scale_resids);
  NF_RETURN_IF_ERROR(ObjectiveFromConfig(c, m));
  return m;
}

absl::StatusOr<ModelConfig> Gpt2FromConfig(const ConfigReader& c) {
  ModelConfig m;
  NF_ASSIGN_OR_RETURN(const int32_t vocab, c.Int("vocab_size"));
  NF_ASSIGN_OR_RETURN(const int32_t d, c.Int("n_embd"));
  NF_ASSIGN_OR_RETURN(const int32_t layers, c.Int("n_layer"));
  NF_ASSIGN_OR_RETURN(const int32_t heads, c.Int("n_head"));
  NF_ASSIGN_OR_RETURN(const int32_t positions, c.Int("n_positions"));
  // GPT-2's n_inner null means 4 n_embd.
  int32_t ffn = 4 * d;
  if (const JsonValue* inner = c.Find("n_inner");
      inner != nullptr && inner->kind != JsonValue::Kind::kNull) {
    NF_ASSIGN_OR_RETURN(ffn, c.Int("n_inner"));
  }
  NF_ASSIGN_OR_RETURN(const std::string act,
                      c.Choice("activation_function", {"gelu_new", "gelu_pytorch_tanh", "gelu"},
                               std::string("gelu_new")));
  NF_ASSIGN_OR_RETURN(const float eps, c.Float("layer_norm_epsilon", 1e-5f));
  NF_ASSIGN_OR_RETURN(const float embd_pdrop, c.Float("embd_pdrop", 0.1f));
  NF_ASSIGN_OR_RETURN(const float resid_pdrop, c.Float("resid_pdrop", 0.1f));
  NF_ASSIGN_OR_RETURN(const float attn_pdrop, c.Float("attn_pdrop", 0.1f));
  // GPT-2's options that change the function: each must be what this model computes.
  for (const auto& [key, wanted] :
       std::vector<std::pair<std::string, bool>>{{"scale_attn_weights", true},
                                                 {"scale_attn_by_inverse_layer_idx", false},
                                                 {"reorder_and_upcast_attn", false},
                                                 {"tie_word_embeddings", true},
                                                 {"add_cross_attention", false}}) {
    NF_ASSIGN_OR_RETURN(const bool value, c.Bool(key, wanted));
    if (value != wanted) {
      return c.Error(
          key, absl::StrCat("is ", value ? "true" : "false", ": only ", wanted ? "true" : "false",
                            " is a model normformer computes"));
    }
  }
  if (embd_pdrop != resid_pdrop) {
    return c.Error(
        "embd_pdrop",
        absl::StrCat("is ", FloatText(embd_pdrop), " and resid_pdrop ", FloatText(resid_pdrop),
                     ": normformer has one residual dropout (model.dropout)"));
  }
  m.set_vocab_size(vocab);
  m.set_d_model(d);
  m.set_num_layers(layers);
  m.set_num_heads(heads);
  m.set_ffn_dim(ffn);
  m.set_max_seq_len(positions);
  m.set_first_position(0);
  m.set_positions(ModelConfig::LEARNED);
  m.set_activation(act == "gelu" ? ModelConfig::GELU : ModelConfig::GELU_TANH);
  m.set_layer_norm_eps(eps);
  m.set_scale_embedding(false);
  m.set_tie_embeddings(true);
  m.set_dropout(resid_pdrop);
  m.set_attention_dropout(attn_pdrop);
  m.set_activation_dropout(0.0f);
  NormFormerConfig* nf = m.mutable_normformer();
  nf->set_scale_attn(false);
  nf->set_scale_heads(false);
  nf->set_scale_fc(false);
  nf->set_scale_resids(false);
  return m;
}

// ---- tensors ----

// The checkpoint's name with "decoder." read as "model.", except the head: the untied projection
// is lm_head.weight, and a masked LM's decoder.lm_head.{dense,layer_norm,bias} lm_head.*, so
// that NormFormerForMaskedLM's lm_head holds RoBERTa's head whole (its projection, tied or not,
// lm_head.weight).
std::string HfName(absl::string_view name) {
  if (name == "decoder.output_projection.weight") return "lm_head.weight";
  if (absl::ConsumePrefix(&name, "decoder.lm_head.")) return absl::StrCat("lm_head.", name);
  return absl::StrReplaceAll(name, {{"decoder.", "model."}});
}

std::vector<HfTensor> NormFormerTensors(const ModelConfig& model) {
  std::vector<HfTensor> tensors;
  for (const model::ParamSpec& spec : model::NormFormerParamSpecs(model, model.vocab_size())) {
    tensors.push_back({.name = HfName(spec.name),
                       .shape = spec.global_shape,
                       .sources = {spec.name},
                       .first_row = 0,
                       .rows = spec.global_shape[0]});
  }
  return tensors;
}

// [in, out] of a linear layer whose weights stack `sources` ([out_i, in] each) by rows.
HfTensor Conv1D(std::string name, std::vector<std::string> sources, int64_t in, int64_t out) {
  return {.name = std::move(name),
          .shape = {in, out},
          .sources = std::move(sources),
          .first_row = 0,
          .rows = out,
          .transposed = true};
}

HfTensor Vector(std::string name, std::vector<std::string> sources, int64_t size) {
  return {.name = std::move(name), .shape = {size}, .sources = std::move(sources), .rows = size};
}

std::vector<HfTensor> Gpt2Tensors(const ModelConfig& model) {
  const int64_t d = model.d_model(), ffn = model.ffn_dim(), vocab = model.vocab_size();
  std::vector<HfTensor> t;
  t.push_back({.name = "transformer.wte.weight",
               .shape = {vocab, d},
               .sources = {"decoder.embed_tokens.weight"},
               .rows = vocab});
  t.push_back({.name = "transformer.wpe.weight",
               .shape = {model.max_seq_len(), d},
               .sources = {"decoder.embed_positions.weight"},
               .first_row = model.first_position(),
               .rows = model.max_seq_len()});
  for (int layer = 0; layer < model.num_layers(); ++layer) {
    const std::string p = model::LayerPrefix(layer) + ".";
    const std::string h = absl::StrCat("transformer.h.", layer, ".");
    for (const char* part : {"weight", "bias"}) {
      t.push_back(Vector(absl::StrCat(h, "ln_1.", part),
                         {absl::StrCat(p, "self_attn_layer_norm.", part)}, d));
    }
    t.push_back(Conv1D(h + "attn.c_attn.weight",
                       {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                        p + "self_attn.v_proj.weight"},
                       d, 3 * d));
    t.push_back(Vector(
        h + "attn.c_attn.bias",
        {p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"},
        3 * d));
    t.push_back(Conv1D(h + "attn.c_proj.weight", {p + "self_attn.out_proj.weight"}, d, d));
    t.push_back(Vector(h + "attn.c_proj.bias", {p + "self_attn.out_proj.bias"}, d));
    for (const char* part : {"weight", "bias"}) {
      t.push_back(
          Vector(absl::StrCat(h, "ln_2.", part), {absl::StrCat(p, "final_layer_norm.", part)}, d));
    }
    t.push_back(Conv1D(h + "mlp.c_fc.weight", {p + "fc1.weight"}, d, ffn));
    t.push_back(Vector(h + "mlp.c_fc.bias", {p + "fc1.bias"}, ffn));
    t.push_back(Conv1D(h + "mlp.c_proj.weight", {p + "fc2.weight"}, ffn, d));
    t.push_back(Vector(h + "mlp.c_proj.bias", {p + "fc2.bias"}, d));
  }
  for (const char* part : {"weight", "bias"}) {
    t.push_back(Vector(absl::StrCat("transformer.ln_f.", part),
                       {absl::StrCat("decoder.layer_norm.", part)}, d));
  }
  return t;
}

// Rows of a source ([rows, cols], or [rows] as [rows, 1]).
int64_t Rows(const Shape& shape) { return shape.empty() ? 1 : shape[0]; }
int64_t Cols(const Shape& shape) {
  int64_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  return cols;
}

// The stacked sources' columns (all sources have the same) and the first stacked row of each.
absl::StatusOr<std::pair<int64_t, std::vector<int64_t>>> StackLayout(
    const HfTensor& tensor, const std::vector<Shape>& source_shapes) {
  if (source_shapes.size() != tensor.sources.size() || source_shapes.empty()) {
    return absl::InternalError(absl::StrCat(tensor.name, ": ", source_shapes.size(),
                                            " source shapes for ", tensor.sources.size(),
                                            " sources"));
  }
  const int64_t cols = Cols(source_shapes[0]);
  std::vector<int64_t> starts;
  int64_t rows = 0;
  for (const Shape& shape : source_shapes) {
    if (Cols(shape) != cols) {
      return absl::InternalError(absl::StrCat(tensor.name, ": sources of unequal widths"));
    }
    starts.push_back(rows);
    rows += Rows(shape);
  }
  if (tensor.first_row < 0 || tensor.first_row + tensor.rows > rows) {
    return absl::InternalError(absl::StrCat(tensor.name, ": rows [", tensor.first_row, ", ",
                                            tensor.first_row + tensor.rows, ") of a stack of ",
                                            rows));
  }
  return std::make_pair(cols, std::move(starts));
}

// [rows, cols] elements of `element` bytes each into [cols, rows].
void Transpose(const char* from, char* to, int64_t rows, int64_t cols, size_t element) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      std::memcpy(to + static_cast<size_t>(c * rows + r) * element,
                  from + static_cast<size_t>(r * cols + c) * element, element);
    }
  }
}

}  // namespace

absl::string_view HfModelTypeName(HfModelType type) {
  return type == HfModelType::kGpt2 ? "gpt2" : "normformer";
}

absl::Status CheckGpt2Represents(const ModelConfig& model) {
  if (IsMaskedLm(model)) {
    return absl::InvalidArgumentError(Refusal(
        "model.objective", "is MASKED_LM (GPT-2 is a causal decoder without RoBERTa's head)"));
  }
  const NormFormerConfig& nf = model.normformer();
  if (nf.scale_attn() || nf.scale_heads() || nf.scale_fc() || nf.scale_resids()) {
    return absl::InvalidArgumentError(
        Refusal("model.normformer", "has a NormFormer operation on (GPT-2 is the Pre-LN layer)"));
  }
  if (model.positions() != ModelConfig::LEARNED) {
    return absl::InvalidArgumentError(
        Refusal("model.positions", "is SINUSOIDAL (GPT-2 learns its positions)"));
  }
  if (!model.tie_embeddings()) {
    return absl::InvalidArgumentError(
        Refusal("model.tie_embeddings", "is false (GPT-2's head is its embedding)"));
  }
  if (model.scale_embedding()) {
    return absl::InvalidArgumentError(
        Refusal("model.scale_embedding", "is true (GPT-2 does not scale its embedding)"));
  }
  if (model.activation() == ModelConfig::RELU_SQUARED) {
    return absl::InvalidArgumentError(Refusal("model.activation", "is RELU_SQUARED"));
  }
  if (model.activation_dropout() != 0.0f) {
    return absl::InvalidArgumentError(
        Refusal("model.activation_dropout", "is not 0 (GPT-2 has no dropout there)"));
  }
  return absl::OkStatus();
}

std::string HfConfigJson(const ModelConfig& model, HfModelType type, DType dtype,
                         std::optional<int32_t> end_of_document) {
  std::vector<std::pair<std::string, std::string>> members =
      type == HfModelType::kGpt2 ? Gpt2Members(model) : NormFormerMembers(model);
  members.push_back({"bos_token_id", TokenId(end_of_document)});
  members.push_back({"eos_token_id", TokenId(end_of_document)});
  members.push_back({"pad_token_id", "null"});
  members.push_back({"dtype", Quoted(TorchDTypeName(dtype))});
  // A masked LM attends both ways and keeps no keys and values.
  members.push_back({"use_cache", Bool(!IsMaskedLm(model))});
  members.push_back({"transformers_version", Quoted(kTransformersVersion)});
  return JsonObject(members);
}

std::string HfGenerationConfigJson(std::optional<int32_t> end_of_document) {
  return JsonObject({{"bos_token_id", TokenId(end_of_document)},
                     {"eos_token_id", TokenId(end_of_document)},
                     {"transformers_version", Quoted(kTransformersVersion)}});
}

absl::StatusOr<HfConfig> ParseHfConfig(absl::string_view json, const fs::path& file) {
  absl::StatusOr<JsonValue> root = ParseJson(json);
  if (!root.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.string(), ": not JSON: ", root.status().message()));
  }
  if (root->kind != JsonValue::Kind::kObject) {
    return absl::InvalidArgumentError(absl::StrCat(file.string(), ": not a JSON object"));
  }
  const ConfigReader reader(*root, file);
  NF_ASSIGN_OR_RETURN(const std::string type,
                      reader.Choice("model_type", {"normformer", "gpt2"}, std::nullopt));
  HfConfig config;
  config.type = type == "gpt2" ? HfModelType::kGpt2 : HfModelType::kNormFormer;
  NF_ASSIGN_OR_RETURN(config.model, config.type == HfModelType::kGpt2
                                        ? Gpt2FromConfig(reader)
                                        : NormFormerFromConfig(reader));
  // transformers 5 writes "dtype", 4 wrote "torch_dtype".
  const char* dtype_key = reader.Find("dtype") != nullptr ? "dtype" : "torch_dtype";
  NF_ASSIGN_OR_RETURN(
      const std::string dtype,
      reader.Choice(dtype_key, {"float32", "float16", "bfloat16"}, std::string("float32")));
  config.dtype = dtype == "float16"    ? DType::kF16
                 : dtype == "bfloat16" ? DType::kBF16
                                       : DType::kF32;
  RecordModelFieldsExplicitly(config.model);
  if (absl::Status valid = model::ValidateModelConfig(config.model); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(file.string(), ": ", valid.message()));
  }
  return config;
}

std::vector<HfTensor> HfTensors(const ModelConfig& model, HfModelType type) {
  return type == HfModelType::kGpt2 ? Gpt2Tensors(model) : NormFormerTensors(model);
}

absl::StatusOr<Tensor> MakeHfTensor(const HfTensor& tensor, const std::vector<Tensor>& sources,
                                    const std::vector<Shape>& source_shapes) {
  NF_ASSIGN_OR_RETURN(const auto layout, StackLayout(tensor, source_shapes));
  const auto& [cols, starts] = layout;
  const DType dtype = sources.at(0).dtype();
  const size_t element = SizeOf(dtype);
  // The stack's rows [first_row, first_row + rows), gathered source by source.
  NF_ASSIGN_OR_RETURN(Tensor stack, Tensor::HostEmpty(dtype, {tensor.rows * cols}));
  char* out = static_cast<char*>(stack.raw_data());
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].dtype() != dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat(tensor.name, ": its sources have different dtypes"));
    }
    const int64_t begin = std::max(starts[i], tensor.first_row);
    const int64_t end =
        std::min(starts[i] + Rows(source_shapes[i]), tensor.first_row + tensor.rows);
    if (begin >= end) continue;
    std::memcpy(out + static_cast<size_t>((begin - tensor.first_row) * cols) * element,
                static_cast<const char*>(sources[i].raw_data()) +
                    static_cast<size_t>((begin - starts[i]) * cols) * element,
                static_cast<size_t>((end - begin) * cols) * element);
  }
  if (!tensor.transposed) return stack;
  NF_ASSIGN_OR_RETURN(Tensor result, Tensor::HostEmpty(dtype, {tensor.rows * cols}));
  Transpose(out, static_cast<char*>(result.raw_data()), tensor.rows, cols, element);
  return result;
}

absl::StatusOr<Tensor> SourceOfHfTensor(const HfTensor& tensor, const Tensor& data, size_t index,
                                        const std::vector<Shape>& source_shapes) {
  NF_ASSIGN_OR_RETURN(const auto layout, StackLayout(tensor, source_shapes));
  const auto& [cols, starts] = layout;
  const int64_t rows = Rows(source_shapes.at(index));
  const int64_t first = starts[index] - tensor.first_row;  // in the HF tensor's stacked rows
  if (first < 0 || first + rows > tensor.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(tensor.name, " holds only part of ", tensor.sources[index], " (rows ",
                     tensor.first_row, " to ", tensor.first_row + tensor.rows, ")"));
  }
  if (data.numel() != tensor.rows * cols) {
    return absl::InvalidArgumentError(
        absl::StrCat(tensor.name, " has ", data.numel(), " elements, not ", tensor.rows * cols));
  }
  const size_t element = SizeOf(data.dtype());
  NF_ASSIGN_OR_RETURN(Tensor source, Tensor::HostEmpty(data.dtype(), {rows * cols}));
  char* out = static_cast<char*>(source.raw_data());
  const char* in = static_cast<const char*>(data.raw_data());
  if (!tensor.transposed) {
    std::memcpy(out, in + static_cast<size_t>(first * cols) * element,
                static_cast<size_t>(rows * cols) * element);
    return source;
  }
  // data is [cols, tensor.rows] (transposed); the source is its columns [first, first + rows).
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      std::memcpy(out + static_cast<size_t>(r * cols + c) * element,
                  in + static_cast<size_t>(c * tensor.rows + first + r) * element, element);
    }
  }
  return source;
}

}  // namespace nf::checkpoint
