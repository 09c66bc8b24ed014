// The options of a SentencePiece model that decide where a long text may be cut and which side
// of a cut a space belongs to (Tokenizer::space_at_cut), read from the model's serialized
// ModelProto: libsentencepiece's
// public API gives the proto only as bytes (its generated header is not installed, and this
// build must not link protobuf, see data/CMakeLists.txt), so the few fields needed are read
// from protobuf's wire format here.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace nf::data {

// With their defaults in sentencepiece_model.proto, which apply when a field is absent.
struct SentencePieceModelOptions {
  // NormalizerSpec.add_dummy_prefix (field 3): every text is encoded as if it began with a
  // space, so "world" alone and in "hello world" give the same pieces.
  bool add_dummy_prefix = true;
  // TrainerSpec.treat_whitespace_as_suffix (field 24): pieces end with the space ("world▁")
  // instead of starting with it.
  bool treat_whitespace_as_suffix = false;
  // NormalizerSpec.remove_extra_whitespaces (field 4): leading, trailing and repeated
  // whitespace is removed, so a run of whitespace is one word boundary wherever it lies.
  bool remove_extra_whitespaces = true;
  // TrainerSpec.split_by_whitespace (field 22): no piece spans a whitespace.
  bool split_by_whitespace = true;
  // TrainerSpec.model_type (field 3) is UNIGRAM (1, the default), not BPE, WORD or CHAR: the
  // model picks the best-scoring segmentation of each text (Viterbi).
  bool unigram = true;
};

// From ModelProto's bytes (trainer_spec is field 2, normalizer_spec field 3). InvalidArgument
// when they are not well-formed protobuf wire format.
absl::StatusOr<SentencePieceModelOptions> ReadModelOptions(absl::string_view model_proto);

// The ModelProto `model_proto` (well-formed, as ReadModelOptions accepts) with add_dummy_prefix
// off: a second normalizer_spec holding only that field is appended, which protobuf's parser
// merges into the first (the last value of a field wins). Such a model encodes a text that
// continues a word cut before it (or, with whitespace as suffix, one that a cut after it
// continues) without the word boundary the dummy prefix would add there.
std::string WithoutDummyPrefix(absl::string_view model_proto);

// What a model's vocabulary says about itself, for tools that describe the tokenizer to others
// (nf-ckpt's Hugging Face export) without loading the library.
struct SentencePieceVocabulary {
  std::vector<std::string> pieces;  // ModelProto.pieces (field 1), in id order
  // TrainerSpec's unk_id (40), eos_id (42) and pad_id (43), with the proto's defaults 0, 2 and
  // -1; -1 (or an id past the pieces) is "none".
  std::optional<int32_t> unk_id, eos_id, pad_id;
};

// From ModelProto's bytes; InvalidArgument as ReadModelOptions.
absl::StatusOr<SentencePieceVocabulary> ReadVocabulary(absl::string_view model_proto);

}  // namespace nf::data
