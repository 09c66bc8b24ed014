#include "checkpoint/fairseq_model.h"

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/manifest_model.h"
#include "google/protobuf/text_format.h"
#include "model/text_proto.h"

namespace nf::checkpoint {
namespace {

using model::ModelConfig;
using model::NormFormerConfig;

const std::string* Find(const SafetensorsMetadata& metadata, absl::string_view key) {
  for (const auto& [k, v] : metadata) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string HeadScaleDescription(const ModelConfig& model) {
  if (!model.normformer().scale_heads()) return "none (scale_heads off)";
  if (model.normformer().head_scale_placement() == NormFormerConfig::AFTER_OUT_PROJ) {
    return "AFTER_OUT_PROJ (fairseq's): c_attn exported as trained";
  }
  return "BEFORE_OUT_PROJ (the paper's): each head's c_attn folded into its columns of "
         "self_attn.out_proj.weight, c_attn exported as 1 (fairseq applies c_attn after out_proj)";
}

std::string PositionDescription(const ModelConfig& model) {
  const std::string numbering =
      "token t of a sequence is position t + 2 (fairseq's make_positions: padding_idx 1 + 1); "
      "fairseq treats token id 1 as padding";
  if (model.positions() == ModelConfig::LEARNED) {
    return absl::StrCat("learned: ", numbering, ", row t + 2 of decoder.embed_positions.weight");
  }
  return absl::StrCat("sinusoidal (computed by fairseq, not stored): ", numbering);
}

}  // namespace

absl::Status CheckFairseqConventions(const ModelConfig& model, absl::string_view architecture) {
  const auto refusal = [&](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fairseq's ", architecture, " cannot represent this model: ", field, " ", why));
  };
  if (model.activation() == ModelConfig::RELU_SQUARED) {
    return refusal("model.activation",
                   "is RELU_SQUARED, which fairseq's activation functions (relu, gelu, "
                   "gelu_accurate, tanh, linear) leave out");
  }
  if (model.first_position() != kFairseqFirstPosition) {
    return refusal(
        "model.first_position",
        absl::StrCat("is ", model.first_position(),
                     ": fairseq numbers a sequence's positions from ", kFairseqFirstPosition,
                     ", so the model would see other positions there "
                     "(checkpoints from before model.first_position numbered from 0; "
                     "`--format safetensors` exports them as they are)"));
  }
  if (model.layer_norm_eps() != kFairseqLayerNormEps) {
    return refusal("model.layer_norm_eps",
                   absl::StrCat("is ", model.layer_norm_eps(), ": fairseq's LayerNorm uses 1e-05"));
  }
  if (model.positions() == ModelConfig::SINUSOIDAL && model.d_model() < 4) {
    return refusal("model.d_model", absl::StrCat("is ", model.d_model(),
                                                 ": fairseq's sinusoidal table divides by "
                                                 "d_model / 2 - 1, which must not be 0"));
  }
  return absl::OkStatus();
}

absl::Status CheckFairseqRepresents(const ModelConfig& model) {
  if (model.objective() == ModelConfig::MASKED_LM) {
    return absl::InvalidArgumentError(
        "fairseq's transformer_lm cannot represent this model: model.objective is MASKED_LM, an "
        "encoder (exported as fairseq's RoBERTa instead)");
  }
  return CheckFairseqConventions(model, "transformer_lm");
}

std::string FairseqFlags(const ModelConfig& model) {
  const NormFormerConfig& nf = model.normformer();
  // Every architectural field is explicit: a field the flags leave out takes the default of
  // fairseq's TransformerLanguageModelConfig (post-LN, 512-wide input and output projections,
  // relu, ...), not the value of this model.
  std::vector<std::string> flags = {
      "--task language_modeling --arch transformer_lm --decoder-normalize-before",
      absl::StrCat("--decoder-layers ", model.num_layers()),
      absl::StrCat("--decoder-embed-dim ", model.d_model()),
      absl::StrCat("--decoder-input-dim ", model.d_model()),
      absl::StrCat("--decoder-output-dim ", model.d_model()),
      absl::StrCat("--decoder-ffn-embed-dim ", model.ffn_dim()),
      absl::StrCat("--decoder-attention-heads ", model.num_heads()),
      absl::StrCat("--activation-fn ",
                   model.activation() == ModelConfig::GELU_TANH ? "gelu_accurate" : "gelu"),
      absl::StrCat("--tokens-per-sample ", model.max_seq_len()),
      absl::StrCat("--max-target-positions ", model.max_seq_len()),
      absl::StrCat("--dropout ", model.dropout()),
      absl::StrCat("--attention-dropout ", model.attention_dropout()),
      absl::StrCat("--activation-dropout ", model.activation_dropout())};
  if (model.positions() == ModelConfig::LEARNED) flags.push_back("--decoder-learned-pos");
  if (model.tie_embeddings()) flags.push_back("--share-decoder-input-output-embed");
  if (!model.scale_embedding()) flags.push_back("--no-scale-embedding");
  if (nf.scale_attn()) flags.push_back("--scale-attn");
  if (nf.scale_fc()) flags.push_back("--scale-fc");
  if (nf.scale_heads()) flags.push_back("--scale-heads");
  if (nf.scale_resids()) flags.push_back("--scale-resids");
  return absl::StrJoin(flags, " ");
}

std::string ModelConfigText(const ModelConfig& model) {
  ModelConfig explicit_model = model;
  RecordModelFieldsExplicitly(explicit_model);
  std::string text;
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  printer.PrintToString(explicit_model, &text);
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

SafetensorsMetadata FairseqExportMetadata(const ModelConfig& model, int64_t step) {
  return {{"format", "pt"},
          {"producer", "normformer"},
          {"step", absl::StrCat(step)},
          {kModelConfigMetadata, ModelConfigText(model)},
          {"normformer.head_scale_placement", HeadScaleDescription(model)},
          {"normformer.positions", PositionDescription(model)},
          {"fairseq.flags", FairseqFlags(model)}};
}

absl::StatusOr<std::optional<ModelConfig>> ModelConfigFromMetadata(
    const SafetensorsMetadata& metadata) {
  const std::string* text = Find(metadata, kModelConfigMetadata);
  if (text == nullptr) return std::nullopt;
  ModelConfig model;
  const std::string where = absl::StrCat("metadata ", kModelConfigMetadata);
  if (absl::Status parsed = model::ParseTextProto(*text, where, model); !parsed.ok()) {
    return absl::DataLossError(
        absl::StrCat(parsed.message(), " (not a model config in text format)"));
  }
  RecordModelFieldsExplicitly(model);
  return model;
}

absl::StatusOr<std::optional<int64_t>> StepFromMetadata(const SafetensorsMetadata& metadata) {
  const std::string* text = Find(metadata, "step");
  if (text == nullptr) return std::nullopt;
  int64_t step = 0;
  if (!absl::SimpleAtoi(*text, &step) || step < 0) {
    return absl::DataLossError(absl::StrCat("metadata step '", *text, "' is not a step"));
  }
  return step;
}

}  // namespace nf::checkpoint
