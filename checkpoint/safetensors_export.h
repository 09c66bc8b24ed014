// Export of a checkpoint's parameters as one safetensors file (the format of Hugging Face's
// `safetensors` package, checkpoint/safetensors_file.h), under the checkpoint's fairseq-style
// names, with the vocabulary tables cut to the real vocabulary: the parameters as they are
// (`nf-ckpt export --format safetensors`). checkpoint/fairseq_export.h writes what fairseq's
// transformer_lm runs exactly.
#pragma once

#include <filesystem>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/safetensors_file.h"
#include "core/dtype.h"

namespace nf::checkpoint {

// Writes `out` (through out.tmp and a rename: an existing file is replaced only by a complete
// one), tensors in the manifest's order, the next read while one is written (memory: two of
// the largest tensor, more when converted). `dtype` converts every tensor (f32, f16 or bf16,
// round to nearest even); nullopt keeps each tensor's own.
absl::Status ExportSafetensors(const std::filesystem::path& dir, const Manifest& manifest,
                               const std::filesystem::path& out, std::optional<DType> dtype);

// The shape the exports give a parameter record: its global shape, a vocabulary table's rows
// cut to the model's vocabulary.
Shape ExportedShape(const Manifest& manifest, const TensorRecord& record);

// A parameter as the exports write it: the whole tensor, a vocabulary table without the
// layout's padding rows, in the checkpoint's dtype.
absl::StatusOr<NamedTensor> ExportedParam(const std::filesystem::path& dir,
                                          const Manifest& manifest, const TensorRecord& record);

// `tensor` converted to `dtype` (round to nearest even); nullopt keeps it.
absl::Status ConvertForExport(NamedTensor& tensor, std::optional<DType> dtype);

}  // namespace nf::checkpoint
