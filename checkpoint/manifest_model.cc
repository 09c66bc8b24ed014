#include "checkpoint/manifest_model.h"

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace nf::checkpoint {
namespace {

namespace pb = google::protobuf;

// Before model.first_position existed, token t used sinusoidal or learned row t.
constexpr int kLegacyFirstPosition = 0;

// Every unset singular field of `message` set to its default, descending into message fields
// (ModelConfig is a tree of scalars, enums and one nested message, without oneofs).
void SetEveryField(pb::Message& message) {
  const pb::Descriptor* descriptor = message.GetDescriptor();
  const pb::Reflection* reflection = message.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const pb::FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated()) continue;
    if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      SetEveryField(*reflection->MutableMessage(&message, field));
      continue;
    }
    if (reflection->HasField(message, field)) continue;
    switch (field->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
        reflection->SetInt32(&message, field, field->default_value_int32());
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        reflection->SetInt64(&message, field, field->default_value_int64());
        break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT:
        reflection->SetFloat(&message, field, field->default_value_float());
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        reflection->SetDouble(&message, field, field->default_value_double());
        break;
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        reflection->SetBool(&message, field, field->default_value_bool());
        break;
      case pb::FieldDescriptor::CPPTYPE_ENUM:
        reflection->SetEnum(&message, field, field->default_value_enum());
        break;
      default:  // ModelConfig has no other kinds; a new one fails the manifest_model test
        break;
    }
  }
}

}  // namespace

void RecordModelFieldsExplicitly(model::ModelConfig& model) { SetEveryField(model); }

void ReadUnrecordedModelFieldsAsLegacy(model::ModelConfig& model) {
  if (!model.has_first_position()) model.set_first_position(kLegacyFirstPosition);
  SetEveryField(model);
}

}  // namespace nf::checkpoint
