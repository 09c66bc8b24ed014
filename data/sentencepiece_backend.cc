#include "data/sentencepiece_backend.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <utility>

namespace nf::data::sentencepiece_backend {
namespace {

Result FromStatus(const sentencepiece::util::Status& status) {
  if (status.ok()) return {};
  return {.code = static_cast<int>(status.code()), .message = status.ToString()};
}

}  // namespace

Model::Model(std::unique_ptr<sentencepiece::SentencePieceProcessor> processor)
    : processor_(std::move(processor)) {}

Model::~Model() = default;

Result Model::Load(const std::string& path, std::unique_ptr<Model>* model) {
  auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
  Result result = FromStatus(processor->Load(path));
  if (result.ok()) model->reset(new Model(std::move(processor)));
  return result;
}

Result Model::LoadFromSerializedProto(std::string_view serialized_proto,
                                     std::unique_ptr<Model>* model) {
  auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
  Result result = FromStatus(processor->LoadFromSerializedProto(serialized_proto));
  if (result.ok()) model->reset(new Model(std::move(processor)));
  return result;
}

Result Model::Encode(std::string_view text, std::vector<int>* ids) const {
  return FromStatus(processor_->Encode(text, ids));
}

Result Model::Decode(const std::vector<int>& ids, std::string* text) const {
  return FromStatus(processor_->Decode(ids, text));
}

int Model::piece_size() const { return processor_->GetPieceSize(); }

int Model::bos_id() const { return processor_->bos_id(); }

int Model::eos_id() const { return processor_->eos_id(); }

int Model::unk_id() const { return processor_->unk_id(); }

int Model::PieceToId(std::string_view piece) const { return processor_->PieceToId(piece); }

bool Model::IsUnknownOrByte(int id) const {
  return processor_->IsUnknown(id) || processor_->IsByte(id);
}

std::string Model::serialized_proto() const { return processor_->serialized_model_proto(); }

Result Train(const std::unordered_map<std::string, std::string>& flags) {
  return FromStatus(sentencepiece::SentencePieceTrainer::Train(flags));
}

}  // namespace nf::data::sentencepiece_backend
