// `nf-ckpt export --format fairseq`: a checkpoint's parameters as one safetensors file that
// fairseq's transformer_lm, built with the flags the file's metadata records, loads and runs to
// this model's logits (up to fp32 rounding). Unlike the plain export (safetensors_export.h) it
//   - writes decoder.version = [3.] (float32), without which fairseq drops the final LayerNorm;
//   - folds a BEFORE_OUT_PROJ head scale into out_proj (fairseq_model.h), c_attn written as 1;
//   - refuses a model fairseq cannot represent (CheckFairseqRepresents), naming the field;
//   - records the model config, placement, position numbering and fairseq flags as metadata.
// Tensors come in the model's parameter order (whatever layout wrote the checkpoint), so the
// same parameters always give the same bytes. A masked LM exports as fairseq's RoBERTa instead
// (fairseq_roberta.h): encoder.sentence_encoder.* and encoder.lm_head.* names, the version buffer
// encoder.sentence_encoder.version, a tied projection listed again as encoder.lm_head.weight, and
// the RoBERTa arguments as metadata; only the Pre-LN encoder is representable.
#pragma once

#include <filesystem>
#include <optional>

#include "absl/status/status.h"
#include "checkpoint/checkpoint.pb.h"
#include "core/dtype.h"

namespace nf::checkpoint {

// Writes `out` (through out.tmp and a rename). `dtype` converts every parameter after folding
// (f32, f16 or bf16, round to nearest even); nullopt keeps each tensor's own.
absl::Status ExportFairseqSafetensors(const std::filesystem::path& dir, const Manifest& manifest,
                                      const std::filesystem::path& out, std::optional<DType> dtype);

}  // namespace nf::checkpoint
