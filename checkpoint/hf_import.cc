#include "checkpoint/hf_import.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/fairseq_model.h"
#include "checkpoint/hf_directory.h"
#include "checkpoint/hf_model.h"
#include "checkpoint/import_tensors.h"
#include "checkpoint/output_path.h"
#include "core/json_value.h"
#include "core/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"
#include "model/model_config_check.h"
#include "model/normformer_params.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;
using model::ModelConfig;

// A gpt2 config.json is run by transformers' own GPT2LMHeadModel, unless an auto_map names code
// to run instead: what that computes is not known here. (The normformer type's auto_map names
// the project's model files, whose model config.json describes; they are never run here.)
absl::Status CheckNoRemoteCode(const HfDirectory& files, HfModelType type) {
  if (type != HfModelType::kGpt2) return absl::OkStatus();
  NF_ASSIGN_OR_RETURN(const JsonValue root, ParseJson(files.config_json));
  if (root.members.count("auto_map") == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      files.config_file.string(),
      ": \"auto_map\" names code that transformers would run instead of GPT2LMHeadModel; what it "
      "computes is not known here (remove auto_map if the model is plain GPT-2)"));
}

// The files of one export record the same metadata `key` (or none do).
absl::Status CheckSameMetadata(const HfDirectory& files, const std::string& key) {
  const auto value_in = [&](const SafetensorsReader& file) -> std::optional<std::string> {
    for (const auto& [k, v] : file.metadata()) {
      if (k == key) return v;
    }
    return std::nullopt;
  };
  const auto text = [](const std::optional<std::string>& v) {
    return v ? JsonQuoted(*v) : std::string("nothing");
  };
  const SafetensorsReader& first = files.files.front();
  for (const SafetensorsReader& file : files.files) {
    if (value_in(file) == value_in(first)) continue;
    return absl::DataLossError(absl::StrCat(file.file().string(), " records ", text(value_in(file)),
                                            " as ", key, " metadata, ", first.file().string(), " ",
                                            text(value_in(first)),
                                            ": the shards come from different exports"));
  }
  return absl::OkStatus();
}

struct Difference {
  std::string field;  // "normformer.scale_fc"; empty when there is none
  std::string a, b;   // its values in text format
};

// The first field in which `a` and `b` differ, by their text format.
Difference FirstDifference(const google::protobuf::Message& a, const google::protobuf::Message& b) {
  const google::protobuf::Descriptor& descriptor = *a.GetDescriptor();
  const google::protobuf::Reflection& reflection = *a.GetReflection();
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor.field(i);
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      Difference inner =
          FirstDifference(reflection.GetMessage(a, field), reflection.GetMessage(b, field));
      if (inner.field.empty()) continue;
      inner.field = absl::StrCat(field->name(), ".", inner.field);
      return inner;
    }
    Difference difference{.field = std::string(field->name()), .a = "", .b = ""};
    google::protobuf::TextFormat::PrintFieldValueToString(a, field, -1, &difference.a);
    google::protobuf::TextFormat::PrintFieldValueToString(b, field, -1, &difference.b);
    if (difference.a != difference.b) return difference;
  }
  return {};
}

// The model: config.json's, or the one the weights record when it agrees with config.json on
// everything config.json states (what config.json would say of it, read back, is config.json's
// model).
absl::StatusOr<ModelConfig> ModelOf(const HfDirectory& files, const HfConfig& config) {
  NF_RETURN_IF_ERROR(CheckSameMetadata(files, kModelConfigMetadata));
  const SafetensorsReader& first = files.files.front();
  absl::StatusOr<std::optional<ModelConfig>> read = ModelConfigFromMetadata(first.metadata());
  if (!read.ok()) {
    return absl::DataLossError(absl::StrCat(first.file().string(), ": ", read.status().message()));
  }
  if (!*read) return config.model;
  const std::string recorded_in =
      absl::StrCat(first.file().string(), "'s ", kModelConfigMetadata, " metadata");
  ModelConfig recorded = **read;
  absl::Status valid = model::ValidateModelConfig(recorded);
  if (valid.ok() && config.type == HfModelType::kGpt2) valid = CheckGpt2Represents(recorded);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(recorded_in, ": ", valid.message()));
  }
  NF_ASSIGN_OR_RETURN(
      const HfConfig stated,
      ParseHfConfig(HfConfigJson(recorded, config.type, config.dtype, std::nullopt), recorded_in));
  if (const Difference d = FirstDifference(config.model, stated.model); !d.field.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(files.config_file.string(), " and ", recorded_in,
                                                   " disagree: model.", d.field, " is ", d.a,
                                                   " by config.json, ", d.b, " by the metadata"));
  }
  // GPT-2's table starts at position 0: the export left out the rows before first_position,
  // which no token uses.
  if (config.type == HfModelType::kGpt2) recorded.set_first_position(0);
  return recorded;
}

// config.json's key (with its value) that decides whether the model has `tensor`, for messages.
std::string KeyFor(const HfConfig& config, const ModelConfig& model, absl::string_view tensor) {
  const auto flag = [](absl::string_view key, bool value) {
    return absl::StrCat(key, " ", value ? "true" : "false");
  };
  if (tensor == "lm_head.weight") return flag("tie_word_embeddings", model.tie_embeddings());
  if (config.type == HfModelType::kGpt2) {
    return absl::StartsWith(tensor, "transformer.h.") ? absl::StrCat("n_layer ", model.num_layers())
                                                      : std::string("model_type \"gpt2\"");
  }
  const model::NormFormerConfig& nf = model.normformer();
  if (absl::StrContains(tensor, "embed_positions")) {
    return absl::StrCat("position_embedding_type \"",
                        model.positions() == ModelConfig::LEARNED ? "learned" : "sinusoidal", "\"");
  }
  if (absl::StrContains(tensor, ".attn_ln.")) return flag("scale_attn", nf.scale_attn());
  if (absl::StrContains(tensor, ".ffn_layernorm.")) return flag("scale_fc", nf.scale_fc());
  if (absl::EndsWith(tensor, ".c_attn")) return flag("scale_heads", nf.scale_heads());
  if (absl::EndsWith(tensor, ".w_resid")) return flag("scale_resids", nf.scale_resids());
  if (absl::StartsWith(tensor, "model.layers.")) {
    return absl::StrCat("num_hidden_layers ", model.num_layers());
  }
  if (absl::StartsWith(tensor, "lm_head.")) {  // RoBERTa's head: dense, layer_norm, bias
    return absl::StrCat("objective \"",
                        model.objective() == ModelConfig::MASKED_LM ? "masked_lm" : "causal_lm",
                        "\"");
  }
  return "model_type \"normformer\"";
}

// config.json's size keys whose value is `dim` ("vocab_size 50"), for a tensor of another shape.
std::string SizeKeysOf(const HfConfig& config, const ModelConfig& model, int64_t dim) {
  const bool gpt2 = config.type == HfModelType::kGpt2;
  const std::vector<std::pair<std::string, int64_t>> sizes = {
      {"vocab_size", model.vocab_size()},
      {gpt2 ? "n_embd" : "hidden_size", model.d_model()},
      {gpt2 ? "n_inner" : "intermediate_size", model.ffn_dim()},
      {gpt2 ? "n_positions" : "max_position_embeddings + first_position",
       model.max_seq_len() + model.first_position()},
      {gpt2 ? "n_head" : "num_attention_heads", model.num_heads()}};
  std::vector<std::string> keys;
  for (const auto& [key, value] : sizes) {
    if (value == dim) keys.push_back(absl::StrCat(key, " ", value));
  }
  return keys.empty() ? std::string("model") : absl::StrJoin(keys, ", ");
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// The files' tensors against the model's HF tensors, by their headers: each present with its
// shape and config.json's dtype, nothing else but a tied head's copy of the embedding (its bytes
// compared), as transformers may write it.
absl::Status MatchTensors(const HfDirectory& files, const HfConfig& config,
                          const ModelConfig& model, const std::vector<HfTensor>& tensors) {
  const std::string disagree =
      absl::StrCat(files.config_file.string(), " and the weights disagree: ");
  std::map<std::string, const HfTensor*> expected;
  for (const HfTensor& tensor : tensors) {
    expected[tensor.name] = &tensor;
    const auto found = files.tensors.find(tensor.name);
    if (found == files.tensors.end()) {
      return absl::FailedPreconditionError(absl::StrCat(disagree, files.weights, " has no ",
                                                        tensor.name, " (config.json's ",
                                                        KeyFor(config, model, tensor.name), ")"));
    }
    const SafetensorsReader& file = files.files[found->second];
    const SafetensorsEntry& entry = *file.Find(tensor.name);
    if (entry.shape != tensor.shape) {
      size_t dim = 0;
      while (dim < entry.shape.size() && dim < tensor.shape.size() &&
             entry.shape[dim] == tensor.shape[dim]) {
        ++dim;
      }
      const std::string keys =
          dim < tensor.shape.size() ? SizeKeysOf(config, model, tensor.shape[dim]) : "model";
      return absl::FailedPreconditionError(
          absl::StrCat(disagree, file.file().string(), " holds ", tensor.name, " as ",
                       ShapeToString(entry.shape), ", not ", ShapeToString(tensor.shape),
                       " (config.json's ", keys, ")"));
    }
    if (entry.dtype != config.dtype) {
      return absl::FailedPreconditionError(absl::StrCat(
          disagree, file.file().string(), " holds ", tensor.name, " as ", DTypeName(entry.dtype),
          ", not ", DTypeName(config.dtype), " (config.json's dtype)"));
    }
  }
  for (const auto& [name, place] : files.tensors) {
    if (expected.count(name) > 0) continue;
    const SafetensorsReader& file = files.files[place];
    if (name == "lm_head.weight" && model.tie_embeddings()) {
      const HfTensor& embedding =
          *std::find_if(tensors.begin(), tensors.end(), [](const HfTensor& t) {
            return t.sources == std::vector<std::string>{"decoder.embed_tokens.weight"};
          });
      NF_ASSIGN_OR_RETURN(const Tensor head, file.Read(name));
      NF_ASSIGN_OR_RETURN(const Tensor table,
                          files.files[files.tensors.at(embedding.name)].Read(embedding.name));
      if (file.Find(name)->shape == embedding.shape && SameBytes(head, table)) continue;
      return absl::FailedPreconditionError(
          absl::StrCat(disagree, file.file().string(), " holds lm_head.weight, which differs from ",
                       embedding.name, " (config.json's tie_word_embeddings true)"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        disagree, file.file().string(), " holds ", name,
        ", which the model has not (config.json's ", KeyFor(config, model, name), ")"));
  }
  return absl::OkStatus();
}

// The checkpoint's parameters cut out of the HF tensors as they are asked for, in the
// parameters' order: the HF tensor that holds the next one read once (GPT-2's c_attn holds q, k
// and v, which follow each other).
class HfParams {
 public:
  HfParams(const HfDirectory& files, const std::vector<HfTensor>& tensors,
           const std::vector<model::ParamSpec>& specs)
      : files_(files), tensors_(tensors) {
    for (const model::ParamSpec& spec : specs) shapes_[spec.name] = spec.global_shape;
    for (size_t t = 0; t < tensors.size(); ++t) {
      for (size_t s = 0; s < tensors[t].sources.size(); ++s) place_[tensors[t].sources[s]] = {t, s};
    }
  }

  // Every parameter is in an HF tensor, and every source of an HF tensor is a parameter.
  absl::Status CheckCovers() const {
    for (const auto& [param, shape] : shapes_) {
      if (place_.count(param) == 0) {
        return absl::InternalError(absl::StrCat("no Hugging Face tensor holds ", param));
      }
    }
    for (const auto& [param, place] : place_) {
      if (shapes_.count(param) == 0) {
        return absl::InternalError(absl::StrCat(tensors_[place.first].name, " is made of ", param,
                                                ", which the model has not"));
      }
    }
    return absl::OkStatus();
  }

  ParamSource Source() {
    return {.dtype = [this](const std::string& param) { return Entry(param).dtype; },
            .read = [this](const std::string& param) { return Read(param); },
            .where = [this](const std::string& param) { return Where(param); }};
  }

 private:
  const HfTensor& TensorOf(const std::string& param) const {
    return tensors_[place_.at(param).first];
  }
  const SafetensorsReader& FileOf(const HfTensor& tensor) const {
    return files_.files[files_.tensors.at(tensor.name)];
  }
  const SafetensorsEntry& Entry(const std::string& param) const {
    const HfTensor& tensor = TensorOf(param);
    return *FileOf(tensor).Find(tensor.name);
  }

  absl::StatusOr<Tensor> Read(const std::string& param) {
    const HfTensor& tensor = TensorOf(param);
    if (!read_ || tensor.name != read_name_) {
      read_.reset();
      NF_ASSIGN_OR_RETURN(read_, FileOf(tensor).Read(tensor.name));
      read_name_ = tensor.name;
    }
    std::vector<Shape> source_shapes;
    for (const std::string& source : tensor.sources) source_shapes.push_back(shapes_.at(source));
    const size_t index = place_.at(param).second;
    NF_ASSIGN_OR_RETURN(Tensor source, SourceOfHfTensor(tensor, *read_, index, source_shapes));
    if (index + 1 == tensor.sources.size()) read_.reset();  // its last part: no longer kept
    return source;
  }

  // The HF tensor, and the parameter when it is only part of it or transposed (the element a
  // message counts is the parameter's).
  std::string Where(const std::string& param) const {
    const HfTensor& tensor = TensorOf(param);
    const std::string where = absl::StrCat(FileOf(tensor).file().string(), ": ", tensor.name);
    if (tensor.sources.size() == 1 && !tensor.transposed) return where;
    return absl::StrCat(where, " (as ", param, ")");
  }

  const HfDirectory& files_;
  const std::vector<HfTensor>& tensors_;
  std::map<std::string, Shape> shapes_;                     // parameter -> global shape
  std::map<std::string, std::pair<size_t, size_t>> place_;  // parameter -> (tensor, source)
  std::string read_name_;                                   // the HF tensor in read_
  std::optional<Tensor> read_;
};

}  // namespace

absl::Status ImportHfDirectory(const fs::path& dir, const HfImportOptions& options,
                               const fs::path& out) {
  NF_RETURN_IF_ERROR(CheckNewOutput(out, "--out", "import writes a new directory",
                                    {{.path = dir, .flag = "HF_DIR"}}));
  NF_ASSIGN_OR_RETURN(const HfDirectory files, OpenHfDirectory(dir));
  NF_ASSIGN_OR_RETURN(const HfConfig config, ParseHfConfig(files.config_json, files.config_file));
  NF_RETURN_IF_ERROR(CheckNoRemoteCode(files, config.type));
  NF_ASSIGN_OR_RETURN(const ModelConfig model, ModelOf(files, config));
  const std::vector<HfTensor> tensors = HfTensors(model, config.type);
  NF_RETURN_IF_ERROR(MatchTensors(files, config, model, tensors));
  std::optional<int64_t> step = options.step;
  if (!step) {
    NF_RETURN_IF_ERROR(CheckSameMetadata(files, "step"));
    absl::StatusOr<std::optional<int64_t>> recorded =
        StepFromMetadata(files.files.front().metadata());
    if (!recorded.ok()) {
      return absl::DataLossError(
          absl::StrCat(files.files.front().file().string(), ": ", recorded.status().message()));
    }
    step = recorded->value_or(0);
  }
  // The whole model's parameters with the real vocabulary's rows.
  const std::vector<model::ParamSpec> specs =
      model::NormFormerParamSpecs(model, model.vocab_size());
  HfParams params(files, tensors, specs);
  NF_RETURN_IF_ERROR(params.CheckCovers());
  return WriteImportedCheckpoint(dir, model, *step, specs, params.Source(), options.layout, out);
}

}  // namespace nf::checkpoint
