// SentencePiece models (unigram or BPE, as trained by spm_train or SentencePieceTrainer) behind
// the Tokenizer interface, and training one from text files.
#pragma once

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

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const override;
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

 private:
  SentencePieceTokenizer(std::unique_ptr<sentencepiece_backend::Model> model,
                         SpaceAtCut space_at_cut, std::vector<std::string> whitespace_cuts);
  std::unique_ptr<sentencepiece_backend::Model> model_;
  SpaceAtCut space_at_cut_;
  std::vector<std::string> whitespace_cuts_;  // UTF-8, for CutsBeforeWhitespace
};

}  // namespace nf::data
