// GPT-2's pre-tokenization: the text is cut into pieces by the regex of openai/gpt-2's
// encoder.py,
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (leftmost match, alternatives tried in order), and BPE then runs inside each piece. std::regex
// has neither \p{..} nor a way to read invalid UTF-8, so this is a scanner written for that one
// pattern; unicode_class.h documents the character classes.
#pragma once

#include <vector>

#include "absl/strings/string_view.h"

namespace nf::data {

// The pieces of `text` in order; they tile it exactly (concatenated they are `text`). Invalid
// UTF-8 bytes are single characters of the [^\s\p{L}\p{N}] class, so any byte string is cut.
std::vector<absl::string_view> Gpt2PreTokenize(absl::string_view text);

}  // namespace nf::data
