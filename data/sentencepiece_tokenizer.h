// SentencePiece models (unigram or BPE, as trained by spm_train or SentencePieceTrainer) behind
// the Tokenizer interface, and training one from text files.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/sentencepiece_backend.h"
#include "data/sentencepiece_model_options.h"
#include "data/tokenizer.h"

namespace nf::data {

struct SentencePieceTrainOptions {
  std::vector<std::string> inputs;  // text files, one sentence per line
  std::string model_prefix;         // writes PREFIX.model and PREFIX.vocab
  int vocab_size = 0;
  std::string model_type = "unigram";  // unigram, bpe, char or word
  // The fraction of characters the vocabulary must cover; the rest become <unk> (or bytes).
  double character_coverage = 0.9995;
  // Spell characters outside the vocabulary as <0xNN> byte pieces instead of <unk> (needs 256
  // byte pieces in the vocabulary, so vocab_size well above 256).
  bool byte_fallback = false;
  // Sentences sampled from the inputs for training; 0: all of them.
  int64_t input_sentence_size = 0;
  int num_threads = 1;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // NotFound or InvalidArgument naming the path when it cannot be read or is not a model.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& path);

  // Trains a model, writing PREFIX.model and PREFIX.vocab. InvalidArgument for bad options
  // (checked here, as SentencePiece aborts the process on some of them), NotFound naming an
  // input that cannot be read, and SentencePiece's own error otherwise.
  static absl::Status Train(const SentencePieceTrainOptions& options);

  ~SentencePieceTokenizer() override;

  // The ids of one SentencePiece call on the whole text, made of calls on the pieces between
  // UnknownRunCuts(text).
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const override;
  // Where Encode cuts `text`: inside runs of characters outside the vocabulary, about every
  // 2 KiB, where a cut is exact (sentencepiece_tokenizer.cc says why and how). libsentencepiece
  // 0.1.97 takes time quadratic in the length of such a run in one call.
  std::vector<size_t> UnknownRunCuts(absl::string_view text) const;
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return model_->piece_size(); }
  // The model's </s> id (2 by SentencePiece's default), unless it was trained without one.
  std::optional<int32_t> end_of_document() const override;
  // From the model's options: kDropped with a dummy prefix (the default), else the side its
  // pieces keep whitespace on. The ids are those of the whole text when the model was also
  // trained with split_by_whitespace (the default: no piece spans a space) and, without a
  // dummy prefix, with remove_extra_whitespaces off (else a chunk's edge space is stripped);
  // except that of two segmentations of a word that score the same, SentencePiece may pick the
  // other one (it compares float running scores, whose rounding depends on the text before).
  SpaceAtCut space_at_cut() const override { return space_at_cut_; }
  // With remove_extra_whitespaces and split_by_whitespace (both SentencePiece's defaults), the
  // whitespace characters the normalizer makes a word boundary of (probed when the model is
  // loaded: NFKC's nmt_nfkc rules make all of Unicode's but U+000B and U+0085 one); exact up to
  // the ties above. None otherwise.
  bool CutsBeforeWhitespace(absl::string_view whitespace) const override;
  // 4 KiB for unigram models, none for the others. A unigram model compares segmentations by a
  // float running score from the text's start, whose rounding grows with the text:
  // libsentencepiece 0.1.97 picks lower-scoring segmentations than sentencepiece 0.2.x's as a
  // text grows (about 200 regions of a 1 MiB document, 7 of a 16 KiB one, none of 4 KiB ones).
  // BPE merges compare scores one pair at a time and do not drift.
  size_t preferred_chunk_bytes() const override { return preferred_chunk_bytes_; }

 private:
  SentencePieceTokenizer(std::unique_ptr<sentencepiece_backend::Model> model,
                         const SentencePieceModelOptions& options);
  // model_->Encode, or nullopt when it fails.
  std::optional<std::vector<int>> TryEncode(absl::string_view text) const;
  // Whether `character` (one, UTF-8) encodes as unknown: <unk> or byte pieces, after the dummy
  // prefix's word start. EncodesAsUnknown encodes it; IsUnknownCharacter looks ASCII up.
  bool EncodesAsUnknown(absl::string_view character) const;
  bool IsUnknownCharacter(absl::string_view character) const;
  // Whether text[0, at) and text[at, ...) may be encoded apart and spliced (AppendSpliced):
  // inside a run of unknown characters, checked on the characters around `at`.
  bool IsCutInUnknownRun(absl::string_view text, size_t at) const;
  // Appends the ids of the text that follows a cut inside a run of unknown characters to those
  // of the text before it: without the word start of the second's dummy prefix, and with the
  // <unk>s on either side of the cut one <unk>, as the whole text has it.
  void AppendSpliced(std::vector<int>& ids, const std::vector<int>& next) const;

  std::unique_ptr<sentencepiece_backend::Model> model_;
  SpaceAtCut space_at_cut_;
  std::vector<std::string> whitespace_cuts_;  // UTF-8, for CutsBeforeWhitespace
  size_t preferred_chunk_bytes_;
  bool add_dummy_prefix_;
  int unk_id_;
  int word_start_id_;                      // the piece "▁" (U+2581), or unk_id_
  std::array<bool, 128> unknown_ascii_{};  // EncodesAsUnknown of each ASCII character
};

}  // namespace nf::data
