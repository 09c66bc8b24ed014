// nf-generate's decoding of token ids to text. The tokenizers (nf_tokenizers) must not share a
// process with the protobuf nf-generate reads checkpoints with (data/CMakeLists.txt; nf-eval's
// eval/tokenizer_client.h does the same for encoding), so decoding runs in the helper
// nf-tokenize --decode, started once before MPI starts (a process that has initialised MPI
// should not fork) and kept running: one line of ids in, one record of text out
// (eval/nf_tokenize_main.cc).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "eval/tokenizer_protocol.h"

namespace nf::generate {

class TextDecoder {
 public:
  // Starts `helper` (nf-tokenize) with the tokenizer `flags` name.
  static absl::StatusOr<std::unique_ptr<TextDecoder>> Start(const std::string& helper,
                                                            const eval::TokenizerFlags& flags);
  ~TextDecoder();  // closes the helper's input and waits for it
  TextDecoder(const TextDecoder&) = delete;
  TextDecoder& operator=(const TextDecoder&) = delete;

  // The text of `ids` (bytes as the tokenizer decodes them; may end inside a UTF-8 sequence).
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids);

 private:
  TextDecoder() = default;

  pid_t pid_ = -1;
  FILE* to_helper_ = nullptr;
  FILE* from_helper_ = nullptr;
};

// The text `ids` add after `prompt_ids`: decode(prompt_ids ++ ids) after decode(prompt_ids).
// Decoding the new ids alone is not it for every tokenizer: SentencePiece drops the space that
// starts a text ("▁of" alone decodes to "of"), which after a prompt is a real space. When the
// joint text does not start with the prompt's (a prompt ending inside a character), the new ids'
// own text. `decode` is TextDecoder::Decode or a stand-in.
using DecodeIds = std::function<absl::StatusOr<std::string>(std::span<const int32_t> ids)>;
absl::StatusOr<std::string> ContinuationText(std::span<const int32_t> prompt_ids,
                                             std::span<const int32_t> ids, const DecodeIds& decode);

// `text` with every byte sequence that is not valid UTF-8 replaced by U+FFFD, as Python's
// bytes.decode(errors="replace") and GPT-2's encoder.py decode do, so printed and JSON text is
// valid UTF-8.
std::string ValidUtf8(const std::string& text);

}  // namespace nf::generate
