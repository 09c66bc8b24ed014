// The SentencePiece library calls, behind an interface of standard types only.
//
// Why a file of its own: sentencepiece_processor.h declares `namespace absl { using
// std::string_view; }`, while this build's abseil defines absl::string_view as a class of its
// own, so no file may include both. This header and sentencepiece_backend.cc therefore include
// no abseil header, and sentencepiece_tokenizer.cc (which speaks absl::Status) includes no
// SentencePiece header.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}  // namespace sentencepiece

namespace nf::data::sentencepiece_backend {

// A status as SentencePiece reports it: `code` uses absl::StatusCode's numbering (which
// SentencePiece's own codes copy), 0 is OK.
struct Result {
  int code = 0;
  std::string message;
  bool ok() const { return code == 0; }
};

class Model {
 public:
  // The model at `path` into *model.
  static Result Load(const std::string& path, std::unique_ptr<Model>* model);
  // The model whose ModelProto is `serialized_proto` into *model.
  static Result LoadFromSerializedProto(std::string_view serialized_proto,
                                        std::unique_ptr<Model>* model);
  ~Model();

  Result Encode(std::string_view text, std::vector<int>* ids) const;
  // Ids must be in [0, piece_size()): SentencePiece does not check them.
  Result Decode(const std::vector<int>& ids, std::string* text) const;
  int piece_size() const;
  int bos_id() const;  // -1 when the model has none
  int eos_id() const;  // -1 when the model has none
  int unk_id() const;
  // The id of `piece`, or unk_id() when the vocabulary has no such piece.
  int PieceToId(std::string_view piece) const;
  // Whether `id` stands for text outside the vocabulary: <unk> or a byte piece (<0xNN>).
  bool IsUnknownOrByte(int id) const;
  // The model's ModelProto, serialized (sentencepiece_model_options.h reads it).
  std::string serialized_proto() const;

 private:
  explicit Model(std::unique_ptr<sentencepiece::SentencePieceProcessor> processor);
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

// SentencePieceTrainer::Train with its flags as a map ("input", "model_prefix", ...).
Result Train(const std::unordered_map<std::string, std::string>& flags);

}  // namespace nf::data::sentencepiece_backend
