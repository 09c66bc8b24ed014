#include "checkpoint/fairseq_import.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/fairseq_model.h"
#include "checkpoint/import_tensors.h"
#include "checkpoint/output_path.h"
#include "checkpoint/safetensors_file.h"
#include "core/status.h"
#include "model/model_config_check.h"
#include "model/normformer_params.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;
using model::ModelConfig;

// The file's model config: its metadata's, or the one given for a file without.
absl::StatusOr<ModelConfig> ModelOf(const fs::path& file, const SafetensorsMetadata& metadata,
                                    const ImportOptions& options) {
  NF_ASSIGN_OR_RETURN(std::optional<ModelConfig> recorded, ModelConfigFromMetadata(metadata));
  if (recorded && options.model) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.string(), " records its model config (", kModelConfigMetadata,
                     "); a config is for files without one (a fairseq .pt converted by "
                     "scripts/fairseq-pt-to-safetensors.py)"));
  }
  if (!recorded && !options.model) {
    return absl::InvalidArgumentError(absl::StrCat(file.string(), " records no model config (",
                                                   kModelConfigMetadata,
                                                   " metadata): give the model with --config"));
  }
  const ModelConfig model = recorded ? *recorded : *options.model;
  if (absl::Status valid = model::ValidateModelConfig(model); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.string(), ": ", recorded ? absl::StrCat(kModelConfigMetadata, " metadata: ") : "",
        valid.message()));
  }
  if (absl::Status represents = CheckFairseqRepresents(model); !represents.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.string(), " is a fairseq transformer_lm, and ", represents.message()));
  }
  return model;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// fairseq's decoder runs its final LayerNorm only when the state dict's decoder.version > 2.
absl::Status CheckDecoderVersion(const SafetensorsReader& reader) {
  const fs::path& file = reader.file();
  const std::string consequence =
      "fairseq would load it as a decoder from before 2019 and drop its final LayerNorm "
      "(decoder.layer_norm), which this model always applies";
  if (reader.Find(kFairseqVersionTensor) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(file.string(), " has no ", kFairseqVersionTensor, ": ", consequence));
  }
  NF_ASSIGN_OR_RETURN(const Tensor data, reader.Read(kFairseqVersionTensor));
  NF_ASSIGN_OR_RETURN(const std::vector<float> version, ToFloatVector(data));
  if (version.empty() || !(version[0] > 2.0f)) {
    return absl::FailedPreconditionError(
        absl::StrCat(file.string(), ": ", kFairseqVersionTensor, " is ",
                     version.empty() ? std::string("empty") : absl::StrCat(version[0]),
                     ", not > 2: ", consequence));
  }
  return absl::OkStatus();
}

// The file's tensors against the model's parameters, by their header: every one present with its
// shape (the vocabulary tables with vocab_size rows), nothing else but decoder.version and a
// tied model's copy of the embedding as output_projection (whose bytes are compared).
absl::Status MatchParams(const SafetensorsReader& reader, const ModelConfig& model,
                         const std::vector<model::ParamSpec>& specs) {
  const fs::path& file = reader.file();
  for (const model::ParamSpec& spec : specs) {
    const SafetensorsEntry* entry = reader.Find(spec.name);
    if (entry == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(file.string(), " has no ", spec.name,
                                                        ", which the model has (",
                                                        ModelConfigText(model), ")"));
    }
    if (entry->shape != spec.global_shape) {
      return absl::FailedPreconditionError(
          absl::StrCat(file.string(), ": ", spec.name, " is ", ShapeToString(entry->shape),
                       ", the model's is ", ShapeToString(spec.global_shape)));
    }
  }
  for (const SafetensorsEntry& entry : reader.entries()) {
    const std::string& name = entry.name;
    if (name == kFairseqVersionTensor) continue;
    if (std::any_of(specs.begin(), specs.end(),
                    [&](const model::ParamSpec& s) { return s.name == name; })) {
      continue;
    }
    // fairseq's state dict lists a tied head under both names (one storage).
    if (name == "decoder.output_projection.weight" && model.tie_embeddings()) {
      NF_ASSIGN_OR_RETURN(const Tensor head, reader.Read(name));
      NF_ASSIGN_OR_RETURN(const Tensor embedding, reader.Read("decoder.embed_tokens.weight"));
      if (SameBytes(head, embedding)) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          file.string(),
          ": decoder.output_projection.weight differs from "
          "decoder.embed_tokens.weight, but the model ties them (model.tie_embeddings)"));
    }
    return absl::FailedPreconditionError(absl::StrCat(file.string(), " holds ", name,
                                                      ", which the model has not (",
                                                      ModelConfigText(model), ")"));
  }
  return absl::OkStatus();
}

// fairseq scales out_proj's output by c_attn; a BEFORE_OUT_PROJ model equals that only when the
// scales were folded into out_proj (as the export does) and are 1.
absl::Status CheckUnitHeadScales(const SafetensorsReader& reader, const ModelConfig& model) {
  const fs::path& file = reader.file();
  if (!model.normformer().scale_heads() ||
      model.normformer().head_scale_placement() != model::NormFormerConfig::BEFORE_OUT_PROJ) {
    return absl::OkStatus();
  }
  for (int layer = 0; layer < model.num_layers(); ++layer) {
    const std::string name = model::LayerPrefix(layer) + ".c_attn";
    NF_ASSIGN_OR_RETURN(const Tensor data, reader.Read(name));
    NF_ASSIGN_OR_RETURN(const std::vector<float> scales, ToFloatVector(data));
    for (float s : scales) {
      if (s == 1.0f) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          file.string(), ": ", name, " holds ", s,
          ", not 1: fairseq applies c_attn after out_proj, so this file is a model with "
          "model.normformer.head_scale_placement AFTER_OUT_PROJ (as BEFORE_OUT_PROJ it would "
          "compute something else)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ImportFairseqSafetensors(const fs::path& file, const ImportOptions& options,
                                      const fs::path& out) {
  NF_RETURN_IF_ERROR(CheckNewOutput(out, "--out", "import writes a new directory"));
  NF_ASSIGN_OR_RETURN(const SafetensorsReader reader, SafetensorsReader::Open(file));
  NF_ASSIGN_OR_RETURN(const ModelConfig model, ModelOf(file, reader.metadata(), options));
  NF_RETURN_IF_ERROR(CheckDecoderVersion(reader));
  // The whole model's parameters with the real vocabulary's rows.
  const std::vector<model::ParamSpec> specs =
      model::NormFormerParamSpecs(model, model.vocab_size());
  NF_RETURN_IF_ERROR(MatchParams(reader, model, specs));
  NF_RETURN_IF_ERROR(CheckUnitHeadScales(reader, model));
  std::optional<int64_t> step = options.step;
  if (!step) {
    absl::StatusOr<std::optional<int64_t>> recorded = StepFromMetadata(reader.metadata());
    if (!recorded.ok()) {
      return absl::DataLossError(absl::StrCat(file.string(), ": ", recorded.status().message()));
    }
    step = recorded->value_or(0);
  }
  const ParamSource params{
      .dtype = [&](const std::string& name) { return reader.Find(name)->dtype; },
      .read = [&](const std::string& name) { return reader.Read(name); },
      .where = [&](const std::string& name) { return absl::StrCat(file.string(), ": ", name); }};
  return WriteImportedCheckpoint(file, model, *step, specs, params, options.layout, out);
}

}  // namespace nf::checkpoint
