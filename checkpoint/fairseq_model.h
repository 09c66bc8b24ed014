// fairseq's transformer_lm in this project's terms: which model configs it can run exactly, the
// command-line flags that build one, and the metadata a fairseq export records (what the export
// and the import share). Read from fairseq's transformer_lm.py, transformer_decoder.py,
// transformer_layer.py and the positional embedding modules:
//   - positions: make_positions numbers a sequence's tokens from padding_idx + 1 = 2, so token t
//     uses sinusoidal row t + 2, or row t + 2 of a learned table of max_target_positions + 2
//     rows: model.first_position 2;
//   - c_attn (--scale-heads) scales out_proj's output viewed as heads: AFTER_OUT_PROJ;
//   - the decoder's upgrade_state_dict_named drops the final LayerNorm unless the state dict
//     holds decoder.version > 2 (fairseq registers it as the float32 buffer [3.]).
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors_file.h"
#include "model/model_config.pb.h"

namespace nf::checkpoint {

inline constexpr int kFairseqFirstPosition = 2;  // padding_idx 1, plus 1
// fairseq's LayerNorm is torch.nn.LayerNorm with its default eps.
inline constexpr float kFairseqLayerNormEps = 1e-5f;
inline constexpr char kFairseqVersionTensor[] = "decoder.version";
inline constexpr float kFairseqDecoderVersion = 3.0f;
// The metadata key under which a fairseq export records the model config (text format, every
// field set), which import reads back.
inline constexpr char kModelConfigMetadata[] = "normformer.model_config";

// OK when fairseq's transformer_lm built with FairseqFlags(model) computes what this model
// computes; otherwise InvalidArgument naming the first field it cannot represent and why.
absl::Status CheckFairseqRepresents(const model::ModelConfig& model);

// The conventions fairseq's transformer_lm and RoBERTa share: an activation fairseq has,
// positions from kFairseqFirstPosition, its LayerNorm's eps, a sinusoidal table's d_model >= 4.
// InvalidArgument "fairseq's <architecture> cannot represent this model: <field> ..." otherwise.
absl::Status CheckFairseqConventions(const model::ModelConfig& model,
                                     absl::string_view architecture);

// "--arch transformer_lm --decoder-layers 4 ...": the flags of fairseq-train (task
// language_modeling) that build this architecture; the vocabulary comes from fairseq's
// dictionary, which must list vocab_size symbols in the checkpoint's token order.
std::string FairseqFlags(const model::ModelConfig& model);

// The model config on one line of protobuf text format, every field written out.
std::string ModelConfigText(const model::ModelConfig& model);

// What a fairseq export says about itself: format and producer, the checkpoint's step, the model
// config (ModelConfigText), the head-scale placement and how it was exported, the position
// numbering, and the fairseq flags.
SafetensorsMetadata FairseqExportMetadata(const model::ModelConfig& model, int64_t step);

// The model config a file's metadata records (kModelConfigMetadata), every field set; nullopt
// when it records none; DataLoss when the text does not parse.
absl::StatusOr<std::optional<model::ModelConfig>> ModelConfigFromMetadata(
    const SafetensorsMetadata& metadata);

// The step a file's metadata records ("step"), if any.
absl::StatusOr<std::optional<int64_t>> StepFromMetadata(const SafetensorsMetadata& metadata);

}  // namespace nf::checkpoint
