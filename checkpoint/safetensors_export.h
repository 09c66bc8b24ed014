// Export of a checkpoint's parameters as one safetensors file (the format of Hugging Face's
// `safetensors` package: an 8-byte little-endian header length, a JSON header mapping each
// tensor name to its dtype, shape and byte range, then the raw little-endian data), under the
// checkpoint's fairseq-style names, with the vocabulary tables cut to the real vocabulary.
#pragma once

#include <filesystem>
#include <optional>

#include "absl/status/status.h"
#include "checkpoint/checkpoint.pb.h"
#include "core/dtype.h"

namespace nf::checkpoint {

// Writes `out` (through out.tmp and a rename: an existing file is replaced only by a complete
// one; a failure removes out.tmp). `dtype` converts every tensor (f32, f16 or bf16, round to
// nearest even); nullopt keeps each tensor's own.
absl::Status ExportSafetensors(const std::filesystem::path& dir, const Manifest& manifest,
                               const std::filesystem::path& out, std::optional<DType> dtype);

}  // namespace nf::checkpoint
