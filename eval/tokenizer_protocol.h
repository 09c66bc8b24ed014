// How nf-eval and its tokenizing helper, nf-tokenize, talk (eval/tokenizer_client.h says why
// they are two programs). nf-eval writes the texts to a file; nf-tokenize writes the ids to its
// standard output:
//
//   texts file   per text: its length in bytes (decimal), '\n', the bytes, '\n'
//   output       "vocab_size V end_of_document E\n" (E = -1 when the tokenizer has none), then
//                per text, in order, a line of its ids separated by single spaces
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace nf::eval {

// The tokenizer options nf-eval takes and passes on, as nf-preprocess names them.
struct TokenizerFlags {
  std::string tokenizer;  // "gpt2" or "sentencepiece"
  std::string vocab_file, merges_file;
  std::string spm_model;
  bool parse_special_tokens = false;
};

// OK when the flags name one tokenizer and what it loads from; InvalidArgument saying what is
// missing or does not belong otherwise.
absl::Status CheckTokenizerFlags(const TokenizerFlags& flags);

// The flags as nf-tokenize's arguments.
std::vector<std::string> TokenizerArguments(const TokenizerFlags& flags);

// One record of the texts file, appended to `out`.
void AppendTextRecord(absl::string_view text, std::string& out);

}  // namespace nf::eval
