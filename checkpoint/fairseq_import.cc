#include "checkpoint/fairseq_import.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/durable_files.h"
#include "checkpoint/fairseq_model.h"
#include "checkpoint/manifest_file.h"
#include "core/non_finite.h"
#include "checkpoint/output_path.h"
#include "checkpoint/safetensors_file.h"
#include "checkpoint/save.h"
#include "checkpoint/shard_mapping.h"
#include "core/ops/ops.h"
#include "core/status.h"
#include "model/model_config_check.h"
#include "model/normformer_params.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;
using model::ModelConfig;

std::string ShapeText(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The file's model config: its metadata's, or the one given for a file without.
absl::StatusOr<ModelConfig> ModelOf(const fs::path& file, const SafetensorsContents& contents,
                                    const ImportOptions& options) {
  NF_ASSIGN_OR_RETURN(std::optional<ModelConfig> recorded,
                      ModelConfigFromMetadata(contents.metadata));
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
absl::Status CheckDecoderVersion(const fs::path& file,
                                 const std::map<std::string, NamedTensor*>& by_name) {
  const auto it = by_name.find(kFairseqVersionTensor);
  const std::string consequence =
      "fairseq would load it as a decoder from before 2019 and drop its final LayerNorm "
      "(decoder.layer_norm), which this model always applies";
  if (it == by_name.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(file.string(), " has no ", kFairseqVersionTensor, ": ", consequence));
  }
  NF_ASSIGN_OR_RETURN(const std::vector<float> version, ToFloatVector(it->second->data));
  if (version.empty() || !(version[0] > 2.0f)) {
    return absl::FailedPreconditionError(
        absl::StrCat(file.string(), ": ", kFairseqVersionTensor, " is ",
                     version.empty() ? std::string("empty") : absl::StrCat(version[0]),
                     ", not > 2: ", consequence));
  }
  return absl::OkStatus();
}

// The file's tensors against the model's parameters: every one present with its shape (the
// vocabulary tables with vocab_size rows), nothing else but decoder.version and a tied model's
// copy of the embedding as output_projection.
absl::StatusOr<std::vector<const NamedTensor*>> MatchParams(
    const fs::path& file, const ModelConfig& model,
    const std::map<std::string, NamedTensor*>& by_name,
    const std::vector<model::ParamSpec>& specs) {
  std::vector<const NamedTensor*> matched;
  for (const model::ParamSpec& spec : specs) {
    const auto it = by_name.find(spec.name);
    if (it == by_name.end()) {
      return absl::FailedPreconditionError(absl::StrCat(file.string(), " has no ", spec.name,
                                                        ", which the model has (",
                                                        ModelConfigText(model), ")"));
    }
    if (it->second->shape != spec.global_shape) {
      return absl::FailedPreconditionError(
          absl::StrCat(file.string(), ": ", spec.name, " is ", ShapeText(it->second->shape),
                       ", the model's is ", ShapeText(spec.global_shape)));
    }
    const NonFinite bad = FindNonFinite(it->second->data.raw_data(), it->second->data.numel(),
                                        it->second->data.dtype());
    if (bad.count > 0) {
      return absl::DataLossError(absl::StrCat(file.string(), ": ", spec.name, " holds ", bad.count,
                                              " non-finite values (the first at element ",
                                              bad.first, ")"));
    }
    matched.push_back(it->second);
  }
  for (const auto& [name, tensor] : by_name) {
    if (name == kFairseqVersionTensor) continue;
    if (std::any_of(specs.begin(), specs.end(),
                    [&](const model::ParamSpec& s) { return s.name == name; })) {
      continue;
    }
    // fairseq's state dict lists a tied head under both names (one storage).
    if (name == "decoder.output_projection.weight" && model.tie_embeddings()) {
      if (SameBytes(tensor->data, by_name.at("decoder.embed_tokens.weight")->data)) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          file.string(),
          ": decoder.output_projection.weight differs from "
          "decoder.embed_tokens.weight, but the model ties them (model.tie_embeddings)"));
    }
    return absl::FailedPreconditionError(absl::StrCat(file.string(), " holds ", name,
                                                      ", which the model has not (",
                                                      ModelConfigText(model), ")"));
  }
  return matched;
}

// fairseq scales out_proj's output by c_attn; a BEFORE_OUT_PROJ model equals that only when the
// scales were folded into out_proj (as the export does) and are 1.
absl::Status CheckUnitHeadScales(const fs::path& file, const ModelConfig& model,
                                 const std::map<std::string, NamedTensor*>& by_name) {
  if (!model.normformer().scale_heads() ||
      model.normformer().head_scale_placement() != model::NormFormerConfig::BEFORE_OUT_PROJ) {
    return absl::OkStatus();
  }
  for (int layer = 0; layer < model.num_layers(); ++layer) {
    const std::string name = model::LayerPrefix(layer) + ".c_attn";
    NF_ASSIGN_OR_RETURN(const std::vector<float> scales, ToFloatVector(by_name.at(name)->data));
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

// Removes a directory when the import ends, complete or not.
class RemovedAtExit {
 public:
  explicit RemovedAtExit(fs::path dir) : dir_(std::move(dir)) {}
  RemovedAtExit(const RemovedAtExit&) = delete;
  RemovedAtExit& operator=(const RemovedAtExit&) = delete;
  ~RemovedAtExit() {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

 private:
  const fs::path dir_;
};

// The checkpoint a one-rank run (tp = pp = dp = 1) would save of these parameters and a fresh
// optimizer, written to `dir`: per parameter its value, fp32 master weights and zero moments,
// each one piece of rank_00000.shard. The vocabulary tables keep the file's rows (converting
// pads them for each layout).
absl::StatusOr<Manifest> WriteOneRankCheckpoint(const fs::path& dir, const ModelConfig& model,
                                                int64_t step,
                                                const std::vector<model::ParamSpec>& specs,
                                                const std::vector<const NamedTensor*>& params) {
  Manifest manifest;
  manifest.set_format_version(kFormatVersion);
  manifest.set_step(step);
  manifest.set_consumed_samples(0);
  manifest.set_data_stream_samples(0);
  manifest.set_optimizer_updates(0);
  manifest.set_skipped_total(0);
  *manifest.mutable_model() = model;
  Layout* layout = manifest.mutable_layout();
  layout->set_tensor_parallel(1);
  layout->set_pipeline_parallel(1);
  layout->set_data_parallel(1);
  layout->set_virtual_stages(1);
  layout->set_distributed_optimizer(false);
  const std::string shard = "rank_00000.shard";
  NF_ASSIGN_OR_RETURN(DurableWriter writer, DurableWriter::Create(dir / shard));
  for (size_t i = 0; i < specs.size(); ++i) {
    const NamedTensor& param = *params[i];
    NF_ASSIGN_OR_RETURN(const Tensor master, Tensor::HostZeros(DType::kF32, {param.data.numel()}));
    NF_RETURN_IF_ERROR(ops::Cast(param.data, master));
    NF_ASSIGN_OR_RETURN(const Tensor zeros, Tensor::HostZeros(DType::kF32, {param.data.numel()}));
    const std::pair<TensorRecord::Kind, const Tensor*> kinds[] = {
        {TensorRecord::PARAM, &param.data},
        {TensorRecord::MASTER, &master},
        {TensorRecord::EXP_AVG, &zeros},
        {TensorRecord::EXP_AVG_SQ, &zeros}};
    for (const auto& [kind, data] : kinds) {
      TensorRecord* record = manifest.add_tensors();
      record->set_name(specs[i].name);
      record->set_kind(kind);
      for (int64_t dim : param.shape) record->add_global_shape(dim);
      record->set_dtype(std::string(DTypeName(data->dtype())));
      Piece* piece = record->add_pieces();
      piece->set_file(shard);
      piece->set_offset(writer.size());
      piece->set_length(static_cast<int64_t>(data->nbytes()));
      piece->set_crc32c(Crc32c(data->raw_data(), data->nbytes()));
      piece->set_sharding(ShardingToProto(specs[i].sharding));
      piece->set_tp_rank(0);
      piece->set_tp_size(1);
      piece->set_begin(0);
      piece->set_end(data->numel());
      NF_RETURN_IF_ERROR(writer.Append(data->raw_data(), static_cast<int64_t>(data->nbytes())));
    }
  }
  ShardFile* file = manifest.add_files();
  file->set_name(shard);
  file->set_size(writer.size());
  file->set_world_rank(0);
  NF_RETURN_IF_ERROR(writer.Close());
  NF_ASSIGN_OR_RETURN(DurableWriter manifest_writer, DurableWriter::Create(dir / kManifestName));
  const std::string bytes = EncodeManifest(manifest);
  NF_RETURN_IF_ERROR(manifest_writer.Append(bytes.data(), static_cast<int64_t>(bytes.size())));
  NF_RETURN_IF_ERROR(manifest_writer.Close());
  return manifest;
}

}  // namespace

absl::Status ImportFairseqSafetensors(const fs::path& file, const ImportOptions& options,
                                      const fs::path& out) {
  NF_RETURN_IF_ERROR(CheckNewOutput(out, "--out", "import writes a new directory"));
  std::error_code error;
  NF_ASSIGN_OR_RETURN(SafetensorsContents contents, ReadSafetensors(file));
  NF_ASSIGN_OR_RETURN(const ModelConfig model, ModelOf(file, contents, options));
  std::map<std::string, NamedTensor*> by_name;
  for (NamedTensor& t : contents.tensors) by_name[t.name] = &t;
  NF_RETURN_IF_ERROR(CheckDecoderVersion(file, by_name));
  // The whole model's parameters with the real vocabulary's rows.
  const std::vector<model::ParamSpec> specs =
      model::NormFormerParamSpecs(model, model.vocab_size());
  NF_ASSIGN_OR_RETURN(const std::vector<const NamedTensor*> params,
                      MatchParams(file, model, by_name, specs));
  NF_RETURN_IF_ERROR(CheckUnitHeadScales(file, model, by_name));
  std::optional<int64_t> step = options.step;
  if (!step) {
    absl::StatusOr<std::optional<int64_t>> recorded = StepFromMetadata(contents.metadata);
    if (!recorded.ok()) {
      return absl::DataLossError(absl::StrCat(file.string(), ": ", recorded.status().message()));
    }
    step = recorded->value_or(0);
  }

  // Beside `out` (a trailing separator would put it inside).
  const fs::path staging = (out.has_filename() ? out : out.parent_path()).string() + ".import.tmp";
  fs::remove_all(staging, error);
  fs::create_directories(staging, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", staging.string(), ": ", error.message()));
  }
  RemovedAtExit remove_staging(staging);
  NF_ASSIGN_OR_RETURN(const Manifest one_rank,
                      WriteOneRankCheckpoint(staging, model, *step, specs, params));
  return ConvertCheckpoint(staging, one_rank, options.layout, out);
}

}  // namespace nf::checkpoint
