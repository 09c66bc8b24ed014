// GPT-2's byte-level BPE, as openai/gpt-2's encoder.py defines it, loaded from the vocab.json
// (token -> id) and merges.txt that GPT-2, fairseq's NormFormer models and Megatron ship.
//
// Encoding: the text is cut into pre-tokens (gpt2_pretokenizer.h); each byte of a pre-token
// becomes one symbol through GPT-2's reversible byte -> character map; then, repeatedly, the
// adjacent pair with the best (lowest) merge rank is merged everywhere in the word, left to
// right, until no pair has a rank. Every byte has a symbol, so any byte string encodes, and
// Decode(Encode(x)) == x byte for byte.
//
// The ids are those of Hugging Face `tokenizers` with GPT-2's tokenizer.json
// (tests/data/hf_tokenizers_parity_test.py). Differences from encoder.py: letters and digits are
// Unicode 16.0's, as in `tokenizers` (unicode_class.h), where encoder.py's `regex` module follows
// the newest Unicode; invalid UTF-8 is tokenized byte-wise instead of being undecodable; the load
// checks what encoder.py would find out later with a KeyError.
//
// Text "<|endoftext|>" is ordinary text by default, as in encoder.py and Megatron-LM's
// GPT2BPETokenizer up to core 0.14 (its pieces "<|", "endoftext", "|>"; the end-of-document id
// is appended by the caller), so a document cannot end itself early. ParseSpecialTokens(true)
// reads it as the end-of-document token instead, as `tokenizers` reads GPT-2's added special
// token (what Megatron's HuggingFaceTokenizer, its GPT2BPETokenizer from core 0.15 and
// transformers' GPT2TokenizerFast give; docs/design.md section 6.1); the default is the ids of
// `tokenizers` with encode_special_tokens = True (transformers' split_special_tokens).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/tokenizer.h"

namespace nf::data {

class Gpt2Bpe final : public Tokenizer {
 public:
  // Reads the two files. Errors are one line naming the file, and the line where there is one:
  // NotFound (or the errno's code) when a file cannot be read; InvalidArgument for a malformed
  // file (see FromContents).
  static absl::StatusOr<std::unique_ptr<Gpt2Bpe>> Load(const std::string& vocab_path,
                                                       const std::string& merges_path);

  // The same from the files' contents; the names are only for messages. InvalidArgument unless:
  // vocab.json is one JSON object of token -> id whose ids are exactly 0..N-1, with a token for
  // every one of the 256 byte symbols; merges.txt is a "#version" line and then one merge per
  // line, best first, as two tokens separated by one space, each merge distinct and its two
  // tokens and their concatenation all in the vocabulary.
  static absl::StatusOr<std::unique_ptr<Gpt2Bpe>> FromContents(
      absl::string_view vocab_json, absl::string_view merges_txt,
      absl::string_view vocab_name = "vocab.json", absl::string_view merges_name = "merges.txt");

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const override;
  // The exact bytes (not necessarily UTF-8: ids can end inside a character). Characters of a
  // token outside the byte alphabet (hand-added special tokens) decode as their own UTF-8.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_bytes_.size()); }
  // The id of "<|endoftext|>" when the vocabulary has it (GPT-2's 50256).
  std::optional<int32_t> end_of_document() const override { return end_of_document_; }
  // The same "<|endoftext|>": GPT-2 has no other special token, and Megatron's and Hugging
  // Face's GPT-2 tokenizers (bos_token = eos_token) begin a text with it too.
  std::optional<int32_t> begin_of_document() const override { return end_of_document_; }
  // Whether Encode reads a literal "<|endoftext|>" in the text as end_of_document() (the text on
  // each side of it encoded on its own) or, by default, as text. Call before sharing the
  // tokenizer between threads. InvalidArgument when enabling it without an "<|endoftext|>" in the
  // vocabulary.
  absl::Status ParseSpecialTokens(bool enable);
  absl::string_view special_token_text() const override;
  // Exact: a space before a non-space character always starts a pre-token (` ?\p{L}+` and its
  // siblings take it, and a whitespace run before it ends there), and the pre-tokens before it
  // are the same when the text ends there.
  SpaceAtCut space_at_cut() const override { return SpaceAtCut::kStartsNext; }
  // Exact before every whitespace character that follows a non-whitespace one: no pre-token
  // spans that boundary (the letter, number and other-symbol pre-tokens hold no whitespace, and
  // the whitespace pre-tokens start there), and the pre-tokens after it do not depend on the
  // text before it.
  bool CutsBeforeWhitespace(absl::string_view) const override { return true; }

 private:
  struct Merge {
    int32_t rank;    // line order in merges.txt: lower merges first
    int32_t merged;  // id of the concatenated token
  };
  Gpt2Bpe() = default;
  const Merge* FindMerge(int32_t left, int32_t right) const;
  void AppendWord(absl::string_view piece, std::vector<int32_t>& ids) const;
  std::vector<int32_t> MergeWord(absl::string_view piece) const;

  std::array<int32_t, 256> byte_ids_{};          // the symbol of each byte
  absl::flat_hash_map<uint64_t, Merge> merges_;  // key: left id << 32 | right id
  std::vector<std::string> id_bytes_;            // what each id decodes to
  std::optional<int32_t> end_of_document_;
  bool parse_special_tokens_ = false;
  // Pre-token -> ids, as encoder.py caches: words repeat, and merging is the costly part. The
  // caches are per thread (keyed by this id), so encoding threads never contend: a shared,
  // mutex-sharded cache measured no gain from a second worker (Zipf-frequent words hit the same
  // shards). Each thread's cache is emptied when full, bounding memory on corpora with
  // unbounded vocabularies (numbers, URLs).
  uint64_t cache_id_ = NextCacheId();
  static uint64_t NextCacheId();
};

}  // namespace nf::data
