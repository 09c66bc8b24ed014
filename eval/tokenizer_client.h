// nf-eval's side of tokenization. The tokenizers live in nf_tokenizers, whose SentencePiece
// library carries its own protobuf and must never share a process with the protobuf that
// checkpoints and configs are read with (data/CMakeLists.txt explains the crash). So nf-eval
// does not link them: it runs nf-tokenize, built beside it, on all its texts at once, before MPI
// starts (a process that has initialised MPI should not fork), and reads the ids back
// (eval/tokenizer_protocol.h). Under mpirun every rank does so on its own; the ids are a pure
// function of the texts, so every rank reads the same.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "eval/tokenizer_protocol.h"

namespace nf::eval {

struct TokenizedTexts {
  int64_t vocab_size = 0;
  std::optional<int32_t> end_of_document;
  std::vector<std::vector<int32_t>> ids;  // one per text, in the order given
};

// The ids of `texts` from the program `helper` (nf-tokenize) with the tokenizer `flags` name.
// The helper's own messages reach standard error; its failure is an error naming its exit code.
absl::StatusOr<TokenizedTexts> TokenizeTexts(const std::string& helper, const TokenizerFlags& flags,
                                             const std::vector<std::string>& texts);

// The program `name` in this program's directory (/proc/self/exe); NotFound when it is not
// there.
absl::StatusOr<std::string> ProgramBesideThisOne(const std::string& name);

}  // namespace nf::eval
