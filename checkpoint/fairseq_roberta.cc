#include "checkpoint/fairseq_roberta.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "checkpoint/fairseq_model.h"

namespace nf::checkpoint {
namespace {

using model::ModelConfig;

std::string Refusal(absl::string_view field, absl::string_view why) {
  return absl::StrCat("fairseq's RoBERTa cannot represent this model: ", field, " ", why);
}

const char* PythonBool(bool value) { return value ? "True" : "False"; }

}  // namespace

absl::Status CheckRobertaRepresents(const ModelConfig& model) {
  const model::NormFormerConfig& nf = model.normformer();
  const struct {
    bool on;
    const char* field;
    const char* module;
  } kOperations[] = {
      {nf.scale_attn(), "model.normformer.scale_attn", "post-attention LayerNorm (attn_ln)"},
      {nf.scale_heads(), "model.normformer.scale_heads", "head scales (c_attn)"},
      {nf.scale_fc(), "model.normformer.scale_fc", "FFN LayerNorm (ffn_layernorm)"},
      {nf.scale_resids(), "model.normformer.scale_resids", "residual scale (w_resid)"},
  };
  for (const auto& op : kOperations) {
    if (op.on) {
      return absl::InvalidArgumentError(Refusal(
          op.field, absl::StrCat("is on, and fairseq's TransformerEncoderLayer has no ", op.module,
                                 " (the Pre-LN masked LM exports; "
                                 "`--format safetensors` exports any)")));
    }
  }
  return CheckFairseqConventions(model, "RoBERTa");
}

std::string RobertaName(absl::string_view name) {
  if (absl::ConsumePrefix(&name, "decoder.lm_head.")) return absl::StrCat("encoder.lm_head.", name);
  if (name == "decoder.output_projection.weight") return kRobertaHeadWeight;
  absl::ConsumePrefix(&name, "decoder.");
  return absl::StrCat("encoder.sentence_encoder.", name);
}

std::string RobertaArgs(const ModelConfig& model) {
  const std::vector<std::string> args = {
      "arch='roberta'", absl::StrCat("encoder_layers=", model.num_layers()),
      absl::StrCat("encoder_embed_dim=", model.d_model()),
      absl::StrCat("encoder_ffn_embed_dim=", model.ffn_dim()),
      absl::StrCat("encoder_attention_heads=", model.num_heads()),
      absl::StrCat("activation_fn='",
                   model.activation() == ModelConfig::GELU_TANH ? "gelu_accurate" : "gelu", "'"),
      absl::StrCat("max_positions=", model.max_seq_len()), "encoder_normalize_before=True",
      // The Pre-LN encoder has no embedding LayerNorm; roberta_base's default adds one.
      "layernorm_embedding=False",
      absl::StrCat("no_scale_embedding=", PythonBool(!model.scale_embedding())),
      absl::StrCat("encoder_learned_pos=", PythonBool(model.positions() == ModelConfig::LEARNED)),
      absl::StrCat("untie_weights_roberta=", PythonBool(!model.tie_embeddings())),
      absl::StrCat("dropout=", model.dropout()),
      absl::StrCat("attention_dropout=", model.attention_dropout()),
      absl::StrCat("activation_dropout=", model.activation_dropout())};
  return absl::StrJoin(args, " ");
}

SafetensorsMetadata RobertaExportMetadata(const ModelConfig& model, int64_t step) {
  return {{"format", "pt"},
          {"producer", "normformer"},
          {"step", absl::StrCat(step)},
          {kModelConfigMetadata, ModelConfigText(model)},
          {"normformer.positions",
           "token t of a sequence is position t + 2 (fairseq's make_positions: padding_idx 1 + "
           "1); fairseq treats token id 1 as padding"},
          {"fairseq.roberta_args", RobertaArgs(model)}};
}

}  // namespace nf::checkpoint
