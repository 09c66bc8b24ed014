// `nf-ckpt import`: a safetensors file with fairseq's transformer_lm names (what
// `nf-ckpt export --format fairseq` writes, or scripts/fairseq-pt-to-safetensors.py makes of a
// fairseq .pt checkpoint) becomes a checkpoint directory for any layout, one shard file per rank
// as a run on that layout writes, ready to continue training (checkpoint.load) or evaluate.
//
// The parameters are the file's, bit for bit, in the file's dtype. The optimizer state is a
// fresh run's: fp32 master weights equal to the parameters, both AdamW moments zero and no
// AdamW update yet (optimizer_updates 0, so the learning-rate schedule, which follows the
// updates, warms up again as fresh moments need). The step is the file's `step` metadata (the
// exported checkpoint's: train.train_iters counts on from there) unless given, else 0; no sample
// has been consumed, so a run that loads it reads its data stream from the start.
//
// The model config is the file's normformer.model_config metadata; a file without it (a
// fairseq .pt) needs one given. Refused, naming the tensor or field: a model fairseq cannot
// represent (fairseq_model.h), a missing, extra or differently shaped tensor, a non-finite
// value, a file without decoder.version > 2 (fairseq would run it without the final LayerNorm,
// which this model always has), a tied model whose separate output_projection differs from the
// embedding, and c_attn other than 1 for a BEFORE_OUT_PROJ model (fairseq applies c_attn after
// out_proj: such a file is an AFTER_OUT_PROJ model).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

#include "absl/status/status.h"
#include "checkpoint/convert.h"
#include "model/model_config.pb.h"

namespace nf::checkpoint {

struct ImportOptions {
  // For a file without normformer.model_config; a file with one refuses another.
  std::optional<model::ModelConfig> model;
  std::optional<int64_t> step;  // default: the file's step metadata, else 0
  TargetLayout layout;
};

// Writes the checkpoint to `out` (refused when it exists; staged and renamed when complete).
absl::Status ImportFairseqSafetensors(const std::filesystem::path& file,
                                      const ImportOptions& options,
                                      const std::filesystem::path& out);

}  // namespace nf::checkpoint
