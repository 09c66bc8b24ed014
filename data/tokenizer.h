// The text <-> token-id interface that nf-preprocess and the tools program against, so a corpus
// can be tokenized with GPT-2's byte-level BPE (gpt2_bpe.h) or a SentencePiece model
// (sentencepiece_tokenizer.h) without the pipeline knowing which.
//
// Every method is const and thread-safe: nf-preprocess calls Encode from several worker threads
// on one shared instance.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace nf::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The token ids of `text` (bytes; UTF-8 expected, but implementations must not fail or crash
  // on invalid sequences). Control tokens such as end-of-document are not produced from text
  // (the caller appends them, so a document containing "<|endoftext|>" cannot end itself), unless
  // special_token_text() names the text that stands for one.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const = 0;

  // The bytes the ids stand for; InvalidArgument naming the first id outside the vocabulary.
  virtual absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const = 0;

  // Ids are in [0, vocab_size()).
  virtual int64_t vocab_size() const = 0;

  // The id appended after each document, when the vocabulary defines one.
  virtual std::optional<int32_t> end_of_document() const = 0;

  // The id put before each document when asked (PreprocessOptions::prepend_begin_of_document,
  // RoBERTa's `<s> doc </s>`), when the vocabulary defines one: GPT-2's "<|endoftext|>", its one
  // special token serving as both (as Megatron's and Hugging Face's GPT-2 tokenizers use it);
  // SentencePiece's bos piece (<s>). None unless the tokenizer says so.
  virtual std::optional<int32_t> begin_of_document() const { return std::nullopt; }

  // The text that Encode reads as a special token rather than as text (GPT-2's "<|endoftext|>"
  // when Gpt2Bpe::ParseSpecialTokens is on), empty when there is none: a text cut into chunks
  // must not be cut inside it.
  virtual absl::string_view special_token_text() const { return {}; }

  // Where a single space between two non-space characters goes when a text too long to encode
  // in one call is cut there (chunked_encoding.h), chosen so that the chunks' ids, concatenated,
  // are the ids of the whole text whenever the tokenizer's own splitting allows it.
  enum class SpaceAtCut {
    kStartsNext,    // Encode("a") ++ Encode(" b") == Encode("a b"), as for GPT-2's pre-tokens
    kEndsPrevious,  // Encode("a ") ++ Encode("b"): whitespace ends the pieces
    kDropped,       // Encode("a") ++ Encode("b"): the space each text implicitly starts with
                    // (SentencePiece's dummy prefix) stands for it
  };
  // The default keeps every byte of the text, which is all a tokenizer that does not say more
  // can be promised.
  virtual SpaceAtCut space_at_cut() const { return SpaceAtCut::kStartsNext; }

  // A broader cut, for text without single spaces (paragraphs of CJK text between newlines,
  // double spacing, ideographic spaces): whether a text may be cut before `whitespace` (the bytes
  // of one Unicode White_Space character) where a non-whitespace character precedes it, the
  // whitespace starting the next chunk, with the chunks' ids concatenated those of the whole
  // text. False unless the tokenizer says so.
  virtual bool CutsBeforeWhitespace(absl::string_view /*whitespace*/) const { return false; }

  // The length of text beyond which one Encode call's ids drift from the model's best
  // segmentation: a longer text is cut into chunks of about this size, at its exact cuts
  // (chunked_encoding.h). None (the largest size_t) unless the tokenizer says so.
  virtual size_t preferred_chunk_bytes() const { return SIZE_MAX; }

  // The ids of `chunk`, a piece of a longer text that was cut inside a word (between two
  // characters that are not whitespace, where the tokenizer's splitting would not cut) right
  // before it (`starts_inside_word`) and/or right after it (`ends_inside_word`): joined by
  // AppendIds to the ids of the pieces around, they must spell the text as Encode on the whole
  // text does, though the two halves of the word may be other pieces. The default, Encode,
  // keeps the text wherever encoding adds nothing at a text's edges (GPT-2's bytes);
  // SentencePiece leaves out the dummy prefix's word start there (chunked_encoding.h).
  virtual absl::StatusOr<std::vector<int32_t>> EncodeInsideWord(
      absl::string_view chunk, bool /*starts_inside_word*/, bool /*ends_inside_word*/) const {
    return Encode(chunk);
  }

  // Whether a cut at `at` (a character boundary between two non-whitespace characters of
  // `text`) keeps the text when the pieces on either side are encoded with EncodeInsideWord and
  // joined with AppendIds: checked on the characters around `at`. EncodeInChunks cuts a stretch
  // without an exact cut where this holds. True by default; SentencePiece checks, as its
  // normalizer makes some characters that are not whitespace a word boundary (U+200B).
  virtual bool KeepsTextAcrossCut(absl::string_view /*text*/, size_t /*at*/) const {
    return true;
  }

  // Appends `next`, the ids of the text that follows the text of `ids`, to `ids` as encoding
  // the two texts whole would have them: as they are by default; SentencePiece makes an <unk>
  // on each side the one <unk> it gives a run of unknown characters.
  virtual void AppendIds(std::vector<int32_t>& ids, std::span<const int32_t> next) const {
    ids.insert(ids.end(), next.begin(), next.end());
  }
};

}  // namespace nf::data
