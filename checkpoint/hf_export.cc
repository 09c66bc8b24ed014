#include "checkpoint/hf_export.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/assemble.h"
#include "checkpoint/fairseq_model.h"
#include "checkpoint/hf_model_files.h"
#include "checkpoint/output_path.h"
#include "checkpoint/read_ahead.h"
#include "checkpoint/safetensors_export.h"
#include "checkpoint/safetensors_file.h"
#include "core/files/atomic_file.h"
#include "core/json_value.h"
#include "core/status.h"
#include "model/vocab.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;

// One tensor of the export with what it is made of.
struct PlannedTensor {
  HfTensor tensor;
  std::vector<const TensorRecord*> sources;
  DType dtype = DType::kF32;
  int64_t bytes = 0;
};

// The shards: tensors in order, a new shard whenever the next tensor would take the current one
// past the limit (a tensor larger than the limit alone in its shard), as transformers splits.
std::vector<std::vector<size_t>> PlanShards(const std::vector<PlannedTensor>& tensors,
                                            int64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  int64_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!shards.back().empty() && bytes + tensors[i].bytes > max_shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(i);
    bytes += tensors[i].bytes;
  }
  return shards;
}

std::string ShardName(size_t index, size_t count) {
  if (count == 1) return "model.safetensors";
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, count);
}

// model.safetensors.index.json: the data bytes of all shards and each tensor's file.
std::string IndexJson(const std::vector<PlannedTensor>& tensors,
                      const std::vector<std::vector<size_t>>& shards) {
  int64_t total = 0;
  std::vector<std::string> map;
  for (size_t s = 0; s < shards.size(); ++s) {
    for (size_t i : shards[s]) {
      total += tensors[i].bytes;
      map.push_back(absl::StrCat("    ", JsonQuoted(tensors[i].tensor.name), ": ",
                                 JsonQuoted(ShardName(s, shards.size()))));
    }
  }
  return absl::StrCat("{\n  \"metadata\": {\"total_size\": ", total, "},\n  \"weight_map\": {\n",
                      absl::StrJoin(map, ",\n"), "\n  }\n}\n");
}

absl::StatusOr<std::vector<PlannedTensor>> PlanTensors(const fs::path& dir,
                                                       const Manifest& manifest, HfModelType type,
                                                       std::optional<DType> dtype) {
  std::map<std::string, const TensorRecord*> params;
  for (const TensorRecord& r : manifest.tensors()) {
    if (r.kind() == TensorRecord::PARAM) params[r.name()] = &r;
  }
  std::vector<PlannedTensor> planned;
  for (HfTensor& tensor : HfTensors(manifest.model(), type)) {
    PlannedTensor p{.tensor = std::move(tensor), .sources = {}, .dtype = DType::kF32, .bytes = 0};
    for (const std::string& name : p.tensor.sources) {
      const auto it = params.find(name);
      if (it == params.end()) {
        return absl::FailedPreconditionError(absl::StrCat("checkpoint ", dir.string(), " has no ",
                                                          name, ", which its model config has"));
      }
      NF_ASSIGN_OR_RETURN(const CheckedRecord checked, CheckRecord(dir, manifest, *it->second));
      p.dtype = dtype.value_or(checked.dtype);
      p.sources.push_back(it->second);
    }
    p.bytes = NumElements(p.tensor.shape) * static_cast<int64_t>(SizeOf(p.dtype));
    planned.push_back(std::move(p));
  }
  return planned;
}

// The tensor from its parameters, converted to the export's dtype.
absl::StatusOr<Tensor> ReadTensor(const fs::path& dir, const Manifest& manifest,
                                  const PlannedTensor& planned) {
  std::vector<Tensor> sources;
  std::vector<Shape> shapes;
  for (const TensorRecord* record : planned.sources) {
    NF_ASSIGN_OR_RETURN(NamedTensor t, ExportedParam(dir, manifest, *record));
    NF_RETURN_IF_ERROR(ConvertForExport(t, planned.dtype));
    sources.push_back(std::move(t.data));
    shapes.push_back(std::move(t.shape));
  }
  return MakeHfTensor(planned.tensor, sources, shapes);
}

absl::Status WriteShard(const fs::path& dir, const Manifest& manifest,
                        const std::vector<PlannedTensor>& tensors, const std::vector<size_t>& shard,
                        const fs::path& file) {
  std::vector<SafetensorsEntry> entries;
  for (size_t i : shard) {
    entries.push_back({.name = tensors[i].tensor.name,
                       .dtype = tensors[i].dtype,
                       .shape = tensors[i].tensor.shape});
  }
  const SafetensorsMetadata metadata = {{"format", "pt"},
                                        {"producer", "normformer"},
                                        {"step", absl::StrCat(manifest.step())},
                                        {kModelConfigMetadata, ModelConfigText(manifest.model())}};
  NF_ASSIGN_OR_RETURN(SafetensorsWriter writer,
                      SafetensorsWriter::Create(file, metadata, std::move(entries)));
  NF_RETURN_IF_ERROR(ReadAhead<Tensor>(
      shard.size(), [&](size_t k) { return ReadTensor(dir, manifest, tensors[shard[k]]); },
      [&](size_t, Tensor& data) { return writer.Append(data); }));
  return writer.Commit();
}

}  // namespace

absl::Status ExportHf(const fs::path& dir, const Manifest& manifest, const fs::path& out,
                      const HfExportOptions& options) {
  std::vector<ToolInput> inputs;
  if (options.tokenizer) {
    for (const fs::path* file : {&options.tokenizer->vocab_file, &options.tokenizer->merges_file,
                                 &options.tokenizer->spm_model}) {
      if (!file->empty()) inputs.push_back({.path = *file, .flag = "the tokenizer's files"});
    }
  }
  NF_RETURN_IF_ERROR(CheckNewOutput(out, "--out", "export writes a new directory", inputs));
  const model::ModelConfig& model = manifest.model();
  HfModelType type = HfModelType::kNormFormer;
  if (options.model_type == HfModelType::kGpt2) {
    NF_RETURN_IF_ERROR(CheckGpt2Represents(model));
    type = HfModelType::kGpt2;
  } else if (!options.model_type && CheckGpt2Represents(model).ok()) {
    type = HfModelType::kGpt2;
  }
  NF_ASSIGN_OR_RETURN(const std::vector<PlannedTensor> tensors,
                      PlanTensors(dir, manifest, type, options.dtype));
  NF_ASSIGN_OR_RETURN(StagingDirectory staging, StagingDirectory::Create(out));
  std::optional<int32_t> end_of_document;
  if (options.tokenizer) {
    const bool masked = model.objective() == model::ModelConfig::MASKED_LM;
    NF_ASSIGN_OR_RETURN(
        end_of_document,
        WriteHfTokenizer(*options.tokenizer, staging.path(), model.vocab_size(),
                         model.max_seq_len(),
                         masked ? std::optional(model::MaskTokenId(model)) : std::nullopt));
  }
  const std::vector<std::vector<size_t>> shards = PlanShards(tensors, options.max_shard_bytes);
  for (size_t s = 0; s < shards.size(); ++s) {
    NF_RETURN_IF_ERROR(WriteShard(dir, manifest, tensors, shards[s],
                                  staging.path() / ShardName(s, shards.size())));
  }
  if (shards.size() > 1) {
    NF_RETURN_IF_ERROR(ReplaceFileAtomically(staging.path() / "model.safetensors.index.json",
                                             IndexJson(tensors, shards)));
  }
  // The dtype config.json names: the export's, else the parameters' (all one dtype in a
  // checkpoint).
  const DType dtype = options.dtype.value_or(tensors.empty() ? DType::kF32 : tensors[0].dtype);
  NF_RETURN_IF_ERROR(ReplaceFileAtomically(staging.path() / "config.json",
                                           HfConfigJson(model, type, dtype, end_of_document)));
  // A masked LM does not generate: transformers reads no generation config for it.
  if (model.objective() != model::ModelConfig::MASKED_LM) {
    NF_RETURN_IF_ERROR(ReplaceFileAtomically(staging.path() / "generation_config.json",
                                             HfGenerationConfigJson(end_of_document)));
  }
  if (type == HfModelType::kNormFormer) {
    for (const HfModelFile& file : HfModelFiles()) {
      NF_RETURN_IF_ERROR(
          ReplaceFileAtomically(staging.path() / file.name, std::string(file.contents)));
    }
  }
  return staging.Commit();
}

}  // namespace nf::checkpoint
