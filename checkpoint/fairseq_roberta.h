// fairseq's RoBERTa in this project's terms: which masked-LM configs it runs exactly, the names
// its state dict gives the parameters, and the metadata a RoBERTa export records. Read from
// fairseq's models/roberta/model.py (RobertaEncoder: a TransformerEncoder `sentence_encoder`
// and a RobertaLMHead `lm_head` whose projection is the embedding unless
// untie_weights_roberta), models/transformer/transformer_encoder.py (forward_embedding, the
// final LayerNorm with encoder_normalize_before, upgrade_state_dict_named) and
// modules/transformer_layer.py (TransformerEncoderLayerBase):
//   - the layers are Pre-LN with encoder_normalize_before and have no NormFormer operation
//     (attn_ln, c_attn, ffn_layernorm, w_resid exist in the decoder layer only);
//   - RoBERTa's own settings that no fairseq-train flag turns off (layernorm_embedding,
//     no_scale_embedding) are architecture arguments the checkpoint's args must carry: the
//     export records them all (RobertaArgs);
//   - positions are numbered from padding_idx + 1 = 2, as the decoder's (fairseq_model.h);
//   - upgrade_state_dict_named drops the final LayerNorm unless encoder.sentence_encoder.version
//     >= 2 (the float32 buffer [3.] TransformerEncoderBase registers).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors_file.h"
#include "model/model_config.pb.h"

namespace nf::checkpoint {

inline constexpr char kRobertaVersionTensor[] = "encoder.sentence_encoder.version";
// A tied RoBERTa head still lists its projection under this name (the embedding's tensor).
inline constexpr char kRobertaHeadWeight[] = "encoder.lm_head.weight";

// OK when fairseq's RoBERTa built from RobertaArgs(model) computes what this masked LM computes;
// otherwise InvalidArgument naming the first field it cannot represent and why.
absl::Status CheckRobertaRepresents(const model::ModelConfig& model);

// The fairseq name of a masked LM's parameter: decoder.lm_head.* -> encoder.lm_head.*, the
// untied decoder.output_projection.weight -> encoder.lm_head.weight, any other decoder.* ->
// encoder.sentence_encoder.*.
std::string RobertaName(absl::string_view name);

// "arch='roberta' encoder_layers=4 ...": every architecture argument of fairseq's RoBERTa that
// RobertaModel.build_model reads, as Python assignments.
std::string RobertaArgs(const model::ModelConfig& model);

// The export's metadata: format and producer, the step, the model config, the positions, and
// the RoBERTa arguments (under "fairseq.roberta_args").
SafetensorsMetadata RobertaExportMetadata(const model::ModelConfig& model, int64_t step);

}  // namespace nf::checkpoint
