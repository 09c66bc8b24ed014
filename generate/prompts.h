// nf-generate's prompts: --prompt texts, then those of a --prompt-file: one prompt a line, or, in
// a file whose every non-empty line starts with '{', JSON Lines with a "prompt" (or "text")
// string field. Empty lines of a plain file are skipped.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace nf::generate {

absl::StatusOr<std::vector<std::string>> ReadPromptFile(const std::string& path);

}  // namespace nf::generate
