#include "eval/tokenizer_protocol.h"

#include "absl/strings/str_cat.h"

namespace nf::eval {

absl::Status CheckTokenizerFlags(const TokenizerFlags& flags) {
  if (flags.tokenizer == "gpt2") {
    if (flags.vocab_file.empty() || flags.merges_file.empty()) {
      return absl::InvalidArgumentError("--tokenizer gpt2 needs --vocab-file and --merges-file");
    }
    if (!flags.spm_model.empty()) {
      return absl::InvalidArgumentError("--spm-model is for --tokenizer sentencepiece");
    }
    return absl::OkStatus();
  }
  if (flags.tokenizer == "sentencepiece") {
    if (flags.spm_model.empty()) {
      return absl::InvalidArgumentError("--tokenizer sentencepiece needs --spm-model");
    }
    if (!flags.vocab_file.empty() || !flags.merges_file.empty() || flags.parse_special_tokens) {
      return absl::InvalidArgumentError(
          "--vocab-file, --merges-file and --parse-special-tokens are for --tokenizer gpt2");
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--tokenizer must be gpt2 or sentencepiece, not '", flags.tokenizer, "'"));
}

std::vector<std::string> TokenizerArguments(const TokenizerFlags& flags) {
  std::vector<std::string> args = {"--tokenizer", flags.tokenizer};
  if (flags.tokenizer == "gpt2") {
    args.insert(args.end(), {"--vocab-file", flags.vocab_file, "--merges-file", flags.merges_file});
    if (flags.parse_special_tokens) args.push_back("--parse-special-tokens");
  } else {
    args.insert(args.end(), {"--spm-model", flags.spm_model});
  }
  return args;
}

void AppendTextRecord(absl::string_view text, std::string& out) {
  absl::StrAppend(&out, text.size(), "\n", text, "\n");
}

}  // namespace nf::eval
