// A strict reader for BPE vocabulary files (GPT-2's encoder.json, Hugging Face's vocab.json):
// one flat JSON object mapping token strings to integer ids. Only that shape is accepted, as RFC
// 8259 writes it (UTF-8, \uXXXX escapes with surrogate pairs), so a wrong or damaged file fails
// at load with the place of the problem instead of yielding a vocabulary that encodes wrongly.
// The syntax is read by core/json_cursor.h; this file adds the shape and the ids' rules.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace nf::data {

// The token -> id map of `json`. InvalidArgument "<file>:<line>:<column>: <what>" (line and
// column 1-based, the column in bytes) on a syntax error, a value that is not an integer in
// [0, 2^31), a duplicate key, or invalid UTF-8; `file` only names the source in messages.
absl::StatusOr<absl::flat_hash_map<std::string, int32_t>> ParseVocabJson(absl::string_view json,
                                                                         absl::string_view file);

}  // namespace nf::data
