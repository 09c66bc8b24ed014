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
  // (checked here, as SentencePiece aborts the process on some of them), FailedPrecondition in
  // one line for inputs without a line SentencePiece trains on (1 to kMaxTrainingLineBytes
  // bytes: it skips the others, then failed with "Internal: [!sentences_.empty()]" after some
  // 60 lines of its log), NotFound naming an input that cannot be read, and SentencePiece's own
  // error otherwise.
  static absl::Status Train(const SentencePieceTrainOptions& options);
  // SentencePiece's TrainerSpec.max_sentence_length default: longer lines are not trained on.
  static constexpr size_t kMaxTrainingLineBytes = 4192;

  ~SentencePieceTokenizer() override;

  // The ids of one SentencePiece call on the whole text, made of calls on the pieces between
  // UnknownRunCuts(text).
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const override;
  // Where Encode cuts `text`: inside runs of text outside the vocabulary, about every 2 KiB,
  // where a cut is exact (sentencepiece_tokenizer.cc says why and how): between two grapheme
  // clusters that are each unknown ('e' + U+0301 is: NFKC makes it 'é'), or inside one cluster
  // longer than 16 characters between two unknown characters. libsentencepiece 0.1.97 takes
  // time quadratic in the length of such a run in one call; where no exact cut is found in a
  // run for kForcedCutBytes, it is cut anyway, keeping the text (EncodeInsideWord's rule).
  // So no call sees more than kForcedCutBytes + 2 KiB of a run.
  std::vector<size_t> UnknownRunCuts(absl::string_view text) const;
  static constexpr size_t kForcedCutBytes = 64 << 10;
  // Encode, without the dummy prefix's word start (▁) where the chunk starts inside a word
  // (with whitespace as suffix: without the dummy suffix where it ends inside one), so that
  // the text is kept: SentencePiece would put a space at that cut.
  absl::StatusOr<std::vector<int32_t>> EncodeInsideWord(absl::string_view chunk,
                                                        bool starts_inside_word,
                                                        bool ends_inside_word) const override;
  // Whether the kCutCheckCharacters characters on either side of `at`, encoded whole, decode
  // to what they decode to when encoded apart with EncodeInsideWord: false where the
  // normalizer makes a character next to the cut a word boundary (U+200B) or joins characters
  // across it.
  bool KeepsTextAcrossCut(absl::string_view text, size_t at) const override;
  // One <unk> where `ids` ends with one and `next` starts with one: SentencePiece makes a run
  // of unknown characters one <unk>.
  void AppendIds(std::vector<int32_t>& ids, std::span<const int32_t> next) const override;
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return model_->piece_size(); }
  // The model's </s> id (2 by SentencePiece's default), unless it was trained without one.
  std::optional<int32_t> end_of_document() const override;
  // The model's <s> id (1 by SentencePiece's default, and so in the models nf-preprocess
  // trains), unless it was trained without one (bos_id -1).
  std::optional<int32_t> begin_of_document() const override;
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
                         std::unique_ptr<sentencepiece_backend::Model> bare,
                         const SentencePieceModelOptions& options);
  // The ids of `text`, cut at UnknownRunCuts: whose start begins a word (else it continues one
  // of the text before it) and whose end ends one (else the text after continues it).
  absl::StatusOr<std::vector<int32_t>> EncodeWords(absl::string_view text, bool starts_word,
                                                   bool ends_word) const;
  // One library call: model_, or bare_ where the dummy prefix (suffix) must not be added: the
  // text continues a word (is continued by one). TryEncode: nullopt when it fails.
  sentencepiece_backend::Result EncodeOnce(absl::string_view text, bool starts_word, bool ends_word,
                                           std::vector<int>* ids) const;
  std::optional<std::vector<int>> TryEncode(absl::string_view text, bool starts_word = true,
                                            bool ends_word = true) const;
  // Whether `text` (a grapheme cluster, or a character) encodes as unknown only: <unk> or
  // byte pieces, inside a word. EncodesAsUnknown encodes it; IsUnknown looks ASCII up.
  bool EncodesAsUnknown(absl::string_view text) const;
  bool IsUnknown(absl::string_view text) const;
  // The text within kCutCheckCharacters characters of `at`, encoded whole and encoded in two
  // parts cut at `at` and spliced; nullopt when an encoding fails.
  struct CutIds {
    std::vector<int> whole, spliced;
  };
  std::optional<CutIds> IdsAroundCut(absl::string_view text, size_t at) const;
  // Whether text[0, at) and text[at, ...) may be encoded apart and spliced: IdsAroundCut's two
  // are the same.
  bool CutKeepsIds(absl::string_view text, size_t at) const;
  // An exact cut in a run of unknown text near `at` (a character boundary): see
  // sentencepiece_tokenizer.cc.
  struct Probe {
    std::optional<size_t> cut;
    bool unknown = false;  // the text at `at` is inside a run of unknown text
  };
  Probe ProbeUnknownRun(absl::string_view text, size_t at) const;
  // Appends `next` to `ids` as AppendIds does.
  void Splice(std::vector<int>& ids, std::span<const int> next) const;

  std::unique_ptr<sentencepiece_backend::Model> model_;
  // The model without its dummy prefix; null when it has none (model_ serves).
  std::unique_ptr<sentencepiece_backend::Model> bare_;
  SpaceAtCut space_at_cut_;
  std::vector<std::string> whitespace_cuts_;  // UTF-8, for CutsBeforeWhitespace
  size_t preferred_chunk_bytes_;
  bool dummy_as_suffix_;  // treat_whitespace_as_suffix: the dummy prefix ends the text
  int unk_id_;
  std::array<bool, 128> unknown_ascii_{};  // EncodesAsUnknown of each ASCII character
};

}  // namespace nf::data
