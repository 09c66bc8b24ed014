// `nf-ckpt import HF_DIR`: a Hugging Face model directory (what `nf-ckpt export --format hf`
// writes, or a GPT2LMHeadModel that transformers' save_pretrained wrote) becomes a checkpoint
// directory for any layout, ready to continue training or evaluate, as fairseq_import.h does for
// a fairseq file. Which files are read, and which never: hf_directory.h; the two forms of the
// model and their tensors: hf_model.h.
//
// The parameters are the files' tensors, bit for bit, in their dtype, with a fresh optimizer
// (import_tensors.h). The model config is config.json's; when the weights also record the
// project's own (normformer.model_config metadata, as the HF export writes), the two must agree
// on everything config.json states, and the recorded one is taken, so that what config.json has
// no key for (GPT-2's activation dropout) comes back as it was. The step is --step, else the
// files' step metadata, else 0.
//
// Refused with one line naming the file and the tensor or config.json key, nothing written: a
// model_type other than normformer and gpt2; remote code other than the project's own (a gpt2
// config.json whose auto_map names code, which transformers would run instead of GPT-2); a
// tensor missing, of another shape or dtype than config.json makes it, or one the model has not
// (a tied head's copy of the embedding, byte for byte the same, excepted); a non-finite value;
// shards whose metadata disagree.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

#include "absl/status/status.h"
#include "checkpoint/convert.h"

namespace nf::checkpoint {

struct HfImportOptions {
  std::optional<int64_t> step;  // default: the files' step metadata, else 0
  TargetLayout layout;
};

// Writes the checkpoint to `out` (refused when it exists or lies in `dir`; staged and renamed
// when complete).
absl::Status ImportHfDirectory(const std::filesystem::path& dir, const HfImportOptions& options,
                               const std::filesystem::path& out);

}  // namespace nf::checkpoint
