#include "checkpoint/fairseq_export.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/fairseq_model.h"
#include "checkpoint/output_path.h"
#include "checkpoint/safetensors_export.h"
#include "checkpoint/safetensors_file.h"
#include "core/status.h"
#include "model/normformer_params.h"
#include "model/vocab.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;

// out_proj.weight [d, d] (out, in): input column j belongs to head j / head_dim, and scaling
// head h's output by c[h] before the projection equals scaling those columns by c[h]. Each
// product is rounded once to fp32 (and once more to a 16-bit dtype); c_attn becomes 1.
absl::Status FoldHeadScale(NamedTensor& out_proj, NamedTensor& c_attn, int64_t head_dim) {
  NF_ASSIGN_OR_RETURN(std::vector<float> weight, ToFloatVector(out_proj.data));
  NF_ASSIGN_OR_RETURN(std::vector<float> scale, ToFloatVector(c_attn.data));
  const int64_t in = out_proj.shape[1];
  for (size_t i = 0; i < weight.size(); ++i) {
    weight[i] *= scale[static_cast<int64_t>(i) % in / head_dim];
  }
  NF_ASSIGN_OR_RETURN(out_proj.data,
                      TensorFromFloats(out_proj.data.dtype(), {out_proj.data.numel()}, weight));
  const std::vector<float> ones(scale.size(), 1.0f);
  NF_ASSIGN_OR_RETURN(c_attn.data,
                      TensorFromFloats(c_attn.data.dtype(), {c_attn.data.numel()}, ones));
  return absl::OkStatus();
}

}  // namespace

absl::Status ExportFairseqSafetensors(const fs::path& dir, const Manifest& manifest,
                                      const fs::path& out, std::optional<DType> dtype) {
  NF_RETURN_IF_ERROR(CheckNewOutput(out, "--out", "export writes a new file"));
  const model::ModelConfig& model = manifest.model();
  NF_RETURN_IF_ERROR(CheckFairseqRepresents(model));
  std::map<std::string, const TensorRecord*> params;
  for (const TensorRecord& r : manifest.tensors()) {
    if (r.kind() == TensorRecord::PARAM) params[r.name()] = &r;
  }
  // The whole model's parameters in their fixed order (the padded vocabulary does not matter:
  // only names and order are read).
  std::vector<NamedTensor> tensors;
  std::map<std::string, size_t> index;
  for (const model::ParamSpec& spec :
       model::NormFormerParamSpecs(model, model::PaddedVocabSize(model.vocab_size(), 1))) {
    const auto it = params.find(spec.name);
    if (it == params.end()) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint ", dir.string(), " has no ",
                                                        spec.name, ", which its model config has"));
    }
    NF_ASSIGN_OR_RETURN(NamedTensor t, ExportedParam(dir, manifest, *it->second));
    index[t.name] = tensors.size();
    tensors.push_back(std::move(t));
  }
  if (model.normformer().scale_heads() &&
      model.normformer().head_scale_placement() == model::NormFormerConfig::BEFORE_OUT_PROJ) {
    const int64_t head_dim = model.d_model() / model.num_heads();
    for (int layer = 0; layer < model.num_layers(); ++layer) {
      const std::string p = model::LayerPrefix(layer);
      NF_RETURN_IF_ERROR(FoldHeadScale(tensors[index.at(p + ".self_attn.out_proj.weight")],
                                       tensors[index.at(p + ".c_attn")], head_dim));
    }
  }
  for (NamedTensor& t : tensors) NF_RETURN_IF_ERROR(ConvertForExport(t, dtype));
  // fairseq's state dict lists the decoder's own buffer before its modules' parameters.
  NF_ASSIGN_OR_RETURN(
      const Tensor version,
      TensorFromFloats(DType::kF32, {1}, std::vector<float>{kFairseqDecoderVersion}));
  tensors.insert(tensors.begin(), {.name = kFairseqVersionTensor, .shape = {1}, .data = version});
  return WriteSafetensors(out, FairseqExportMetadata(model, manifest.step()), tensors);
}

}  // namespace nf::checkpoint
