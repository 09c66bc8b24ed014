// `nf-ckpt export --format hf`: a checkpoint as a Hugging Face transformers directory that
// AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True) (a masked LM:
// AutoModelForMaskedLM) and AutoTokenizer.from_pretrained(DIR) load (checkpoint/hf_model.h: the
// two forms; docs/checkpoints.md "Hugging Face"):
//   config.json, a causal LM's generation_config.json, the weights as model.safetensors or, above
//   the shard size, model-0000K-of-0000N.safetensors with model.safetensors.index.json (as
//   transformers' save_pretrained shards), the model files of checkpoint/hf/ for the "normformer"
//   form, and the tokenizer's files when given (hf_tokenizer.h).
// The directory is written under a temporary name and renamed when complete; it must be new and
// outside any checkpoint. Tensors are read, converted and written one at a time (the next read
// while one is written), so memory stays that of the largest few tensors, as the other exports.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

#include "absl/status/status.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/hf_model.h"
#include "checkpoint/hf_tokenizer.h"
#include "core/dtype.h"

namespace nf::checkpoint {

struct HfExportOptions {
  std::optional<DType> dtype;                // nullopt: each parameter's own
  std::optional<HfModelType> model_type;     // nullopt: gpt2 when GPT-2 expresses the model
  int64_t max_shard_bytes = 50'000'000'000;  // transformers 5's default max_shard_size, "50GB"
  std::optional<HfTokenizerFiles> tokenizer;
};

absl::Status ExportHf(const std::filesystem::path& dir, const Manifest& manifest,
                      const std::filesystem::path& out, const HfExportOptions& options);

}  // namespace nf::checkpoint
