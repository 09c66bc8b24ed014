// The tokenizer files of a Hugging Face export, so that AutoTokenizer.from_pretrained(DIR)
// gives nf-preprocess's ids. The files are read as files (data/vocab_json.h,
// data/sentencepiece_model_options.h): nf-ckpt holds protobuf and must not load SentencePiece's
// library (data/CMakeLists.txt).
//   - GPT-2 BPE: vocab.json and merges.txt as given, tokenizer.json (the same BPE for
//     `tokenizers`, byte-level pre-tokenizer and decoder, "<|endoftext|>" an added special token),
//     tokenizer_config.json (GPT2Tokenizer) and special_tokens_map.json;
//   - SentencePiece: the model as tokenizer.model, run by the sentencepiece library itself
//     (transformers' SentencePieceBackend), and tokenizer_config.json naming its special pieces.
// Neither adds a token when encoding (the end-of-document token is appended to documents by
// nf-preprocess, not by encoding), as nf-tokenize encodes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

#include "absl/status/statusor.h"

namespace nf::checkpoint {

struct HfTokenizerFiles {
  enum class Kind { kGpt2, kSentencePiece };
  Kind kind = Kind::kGpt2;
  std::filesystem::path vocab_file, merges_file;  // kGpt2
  std::filesystem::path spm_model;                // kSentencePiece
};

// Writes the tokenizer's files into `dir` and returns its end-of-document id (GPT-2's
// "<|endoftext|>", SentencePiece's eos piece), if it has one. InvalidArgument naming the file
// when a file is malformed or the tokenizer has more ids than the model's `vocab_size`;
// `max_seq_len` is the tokenizer's model_max_length.
absl::StatusOr<std::optional<int32_t>> WriteHfTokenizer(const HfTokenizerFiles& files,
                                                        const std::filesystem::path& dir,
                                                        int64_t vocab_size, int64_t max_seq_len);

}  // namespace nf::checkpoint
