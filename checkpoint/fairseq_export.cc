#include "checkpoint/fairseq_export.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "checkpoint/assemble.h"
#include "checkpoint/fairseq_model.h"
#include "checkpoint/fairseq_roberta.h"
#include "checkpoint/output_path.h"
#include "checkpoint/read_ahead.h"
#include "checkpoint/safetensors_export.h"
#include "checkpoint/safetensors_file.h"
#include "core/status.h"
#include "model/normformer_params.h"
#include "model/vocab.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;

// out_proj.weight [d, d] (out, in): input column j belongs to head j / head_dim, and scaling
// head h's output by c[h] ([heads], the layer's c_attn) before the projection equals scaling
// those columns by c[h]. Each product is rounded once to fp32 (and once more to a 16-bit dtype).
absl::Status FoldHeadScale(NamedTensor& out_proj, const NamedTensor& c_attn, int64_t head_dim) {
  NF_ASSIGN_OR_RETURN(std::vector<float> weight, ToFloatVector(out_proj.data));
  NF_ASSIGN_OR_RETURN(const std::vector<float> scale, ToFloatVector(c_attn.data));
  const int64_t in = out_proj.shape[1];
  for (size_t i = 0; i < weight.size(); ++i) {
    weight[i] *= scale[static_cast<int64_t>(i) % in / head_dim];
  }
  NF_ASSIGN_OR_RETURN(out_proj.data,
                      TensorFromFloats(out_proj.data.dtype(), {out_proj.data.numel()}, weight));
  return absl::OkStatus();
}

// A head scale folded into out_proj is written as 1.
absl::Status SetToOnes(NamedTensor& c_attn) {
  const std::vector<float> ones(static_cast<size_t>(c_attn.data.numel()), 1.0f);
  NF_ASSIGN_OR_RETURN(c_attn.data,
                      TensorFromFloats(c_attn.data.dtype(), {c_attn.data.numel()}, ones));
  return absl::OkStatus();
}

}  // namespace

absl::Status ExportFairseqSafetensors(const fs::path& dir, const Manifest& manifest,
                                      const fs::path& out, std::optional<DType> dtype) {
  NF_RETURN_IF_ERROR(CheckNewOutput(out, "--out", "export writes a new file"));
  const model::ModelConfig& model = manifest.model();
  // A masked LM is fairseq's RoBERTa: its encoder's and head's names, the same tensors.
  const bool roberta = model.objective() == model::ModelConfig::MASKED_LM;
  NF_RETURN_IF_ERROR(roberta ? CheckRobertaRepresents(model) : CheckFairseqRepresents(model));
  const auto fairseq_name = [&](const std::string& name) {
    return roberta ? RobertaName(name) : name;
  };
  std::map<std::string, const TensorRecord*> params;
  for (const TensorRecord& r : manifest.tensors()) {
    if (r.kind() == TensorRecord::PARAM) params[r.name()] = &r;
  }
  // The whole model's parameters in their fixed order (the padded vocabulary does not matter:
  // only names and order are read), after fairseq's own buffer decoder.version (RoBERTa's
  // encoder.sentence_encoder.version), which its state dict lists before the modules'
  // parameters.
  std::vector<const TensorRecord*> records;
  std::vector<SafetensorsEntry> entries = {
      {.name = roberta ? kRobertaVersionTensor : kFairseqVersionTensor,
       .dtype = DType::kF32,
       .shape = {1}}};
  for (const model::ParamSpec& spec :
       model::NormFormerParamSpecs(model, model::PaddedVocabSize(model.vocab_size(), 1))) {
    const auto it = params.find(spec.name);
    if (it == params.end()) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint ", dir.string(), " has no ",
                                                        spec.name, ", which its model config has"));
    }
    NF_ASSIGN_OR_RETURN(const CheckedRecord checked, CheckRecord(dir, manifest, *it->second));
    records.push_back(it->second);
    entries.push_back({.name = fairseq_name(spec.name),
                       .dtype = dtype.value_or(checked.dtype),
                       .shape = ExportedShape(manifest, *it->second)});
  }
  if (roberta && model.tie_embeddings()) {
    // RobertaLMHead holds the embedding as its weight: fairseq's state dict lists it twice.
    const TensorRecord& embedding = *params.at("decoder.embed_tokens.weight");
    NF_ASSIGN_OR_RETURN(const CheckedRecord checked, CheckRecord(dir, manifest, embedding));
    records.push_back(&embedding);
    entries.push_back({.name = kRobertaHeadWeight,
                       .dtype = dtype.value_or(checked.dtype),
                       .shape = ExportedShape(manifest, embedding)});
  }
  NF_ASSIGN_OR_RETURN(
      SafetensorsWriter writer,
      SafetensorsWriter::Create(out,
                                roberta ? RobertaExportMetadata(model, manifest.step())
                                        : FairseqExportMetadata(model, manifest.step()),
                                std::move(entries)));
  NF_ASSIGN_OR_RETURN(
      const Tensor version,
      TensorFromFloats(DType::kF32, {1}, std::vector<float>{kFairseqDecoderVersion}));
  NF_RETURN_IF_ERROR(writer.Append(version));
  // out_proj reads its layer's c_attn (d_model / head_dim values) to fold it.
  const bool fold =
      model.normformer().scale_heads() &&
      model.normformer().head_scale_placement() == model::NormFormerConfig::BEFORE_OUT_PROJ;
  const int64_t head_dim = model.d_model() / model.num_heads();
  // The next parameter is read (and folded, converted) while one is written.
  NF_RETURN_IF_ERROR(ReadAhead<Tensor>(
      records.size(),
      [&](size_t i) -> absl::StatusOr<Tensor> {
        NF_ASSIGN_OR_RETURN(NamedTensor t, ExportedParam(dir, manifest, *records[i]));
        if (fold && absl::EndsWith(t.name, ".self_attn.out_proj.weight")) {
          const std::string c_attn =
              absl::StrCat(absl::StripSuffix(t.name, ".self_attn.out_proj.weight"), ".c_attn");
          NF_ASSIGN_OR_RETURN(NamedTensor scales, ExportedParam(dir, manifest, *params.at(c_attn)));
          NF_RETURN_IF_ERROR(FoldHeadScale(t, scales, head_dim));
        } else if (fold && absl::EndsWith(t.name, ".c_attn")) {
          NF_RETURN_IF_ERROR(SetToOnes(t));  // folded into out_proj
        }
        NF_RETURN_IF_ERROR(ConvertForExport(t, dtype));
        return t.data;
      },
      [&](size_t, Tensor& data) { return writer.Append(data); }));
  return writer.Commit();
}

}  // namespace nf::checkpoint
