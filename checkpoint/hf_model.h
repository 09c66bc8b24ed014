// The model in Hugging Face transformers' terms: the config.json of its two forms and which
// tensor of each form is made of which parameters (what the HF export and the HF import share,
// as fairseq_model.h is for fairseq). docs/checkpoints.md ("Hugging Face") lists the mapping.
//   - "normformer": any model config; the project's own model files (checkpoint/hf/) run it, so
//     loading needs trust_remote_code. Tensors keep the checkpoint's names with "decoder." read
//     as "model." and an untied head as "lm_head.weight"; a head scale is stored as trained. A
//     masked LM is NormFormerForMaskedLM, its RoBERTa head's decoder.lm_head.* as lm_head.*.
//   - "gpt2": transformers' own GPT2LMHeadModel, no remote code, for a causal Pre-LN model GPT-2
//     computes exactly (CheckGpt2Represents). GPT-2's Conv1D stores weights [in, out], so q, k
//     and v are one transposed [d, 3d] tensor, and its position table starts at position 0.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "model/model_config.pb.h"

namespace nf::checkpoint {

enum class HfModelType { kNormFormer, kGpt2 };

// "normformer" or "gpt2": config.json's model_type.
absl::string_view HfModelTypeName(HfModelType type);

// OK when transformers' GPT2LMHeadModel computes what this model computes (and trains it with
// the same dropouts): a causal LM, all four NormFormer switches off, learned positions, a tied
// head, no embedding scale, GELU or GELU_TANH, no activation dropout. Otherwise InvalidArgument
// naming the first field GPT-2 cannot express.
absl::Status CheckGpt2Represents(const model::ModelConfig& model);

// config.json for the model in `type`'s form, its parameters stored in `dtype`.
// `end_of_document` (the tokenizer's, when known) is both bos_token_id and eos_token_id, as in
// GPT-2's own config: generation stops there and lm-eval prefixes a context-free request with
// it.
std::string HfConfigJson(const model::ModelConfig& model, HfModelType type, DType dtype,
                         std::optional<int32_t> end_of_document);

// generation_config.json: bos/eos as above; transformers' defaults otherwise.
std::string HfGenerationConfigJson(std::optional<int32_t> end_of_document);

struct HfConfig {
  HfModelType type = HfModelType::kNormFormer;
  // Every field explicit. A gpt2 config numbers positions from 0 (model.first_position 0);
  // dropouts it has no key for are 0. A normformer config without "objective" (written before
  // masked LMs) is a causal LM; a masked one's mask_token is config.json's mask_token_id.
  model::ModelConfig model;
  DType dtype = DType::kF32;  // "dtype" (or transformers 4's "torch_dtype"); float32 if absent
};

// The config.json text of `file` (for messages) as a model: model_type normformer or gpt2, every
// key the form needs present with a value of its type, the model valid
// (model::ValidateModelConfig). InvalidArgument naming the file and the key otherwise.
absl::StatusOr<HfConfig> ParseHfConfig(absl::string_view json, const std::filesystem::path& file);

// One tensor of the HF form: the checkpoint parameters (global, vocabulary rows cut to
// vocab_size) stacked by rows in `sources` order, rows [first_row, first_row + rows) of that
// stack, then transposed when `transposed` (GPT-2's Conv1D layout). `shape` is the result's.
struct HfTensor {
  std::string name;
  Shape shape;
  std::vector<std::string> sources;
  int64_t first_row = 0;
  int64_t rows = 0;  // of the stack
  bool transposed = false;
};

// Every tensor `type`'s form of the model stores, in the order the export writes them (the
// checkpoint's parameter order). A tied head is not stored (transformers ties it on load).
std::vector<HfTensor> HfTensors(const model::ModelConfig& model, HfModelType type);

// `tensor` made of its sources' data (host, each [numel] in one dtype, in `sources` order; shapes
// from the model's global shapes): host [numel of tensor.shape], same dtype.
absl::StatusOr<Tensor> MakeHfTensor(const HfTensor& tensor, const std::vector<Tensor>& sources,
                                    const std::vector<Shape>& source_shapes);

// The inverse: source `index` of `tensor` (shape `source_shape`) cut out of the HF tensor's data.
absl::StatusOr<Tensor> SourceOfHfTensor(const HfTensor& tensor, const Tensor& data, size_t index,
                                        const std::vector<Shape>& source_shapes);

}  // namespace nf::checkpoint
