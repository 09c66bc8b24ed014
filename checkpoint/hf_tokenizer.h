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
// A masked LM's <mask> (model::MaskTokenId) is the tokenizer's mask_token, a special token that
// transformers splits out of text first, so that "<mask>" in a text is its id and the rest encodes
// as before; it takes in the spaces before it (lstrip, as RoBERTa's <mask>: a masked token held
// its leading space in training). Its text is the tokenizer's own token at that id (special
// now, it is split out of any text: the tokenizer's mask token, not one that text holds), else
// "<mask>" (GPT-2: an added token of tokenizer.json, also put in its BPE vocabulary at the id;
// SentencePiece: tokenizer_config.json's added_tokens_decoder).
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
// "<|endoftext|>", SentencePiece's eos piece), if it has one. `max_seq_len` is the tokenizer's
// model_max_length; `mask_token` a masked LM's <mask> id (nullopt for a causal LM: no mask
// token). InvalidArgument naming the file when a file is malformed or the tokenizer has more ids
// than the model's `vocab_size`, and naming model.mask_token when the <mask> id is outside
// [0, vocab_size), is the end-of-document id, or differs from that of a "<mask>" the tokenizer
// has.
absl::StatusOr<std::optional<int32_t>> WriteHfTokenizer(const HfTokenizerFiles& files,
                                                        const std::filesystem::path& dir,
                                                        int64_t vocab_size, int64_t max_seq_len,
                                                        std::optional<int32_t> mask_token);

}  // namespace nf::checkpoint
