// Loading a TrainConfig from a file and printing it back with every default made explicit.
#include "launcher/config.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"
#include "model/text_proto.h"

namespace nf::launcher {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

absl::Status ReadError(const std::string& path, int error) {
  const std::string message =
      absl::StrCat("cannot read config file ", path, ": ", std::strerror(error));
  return error == ENOENT ? absl::NotFoundError(message) : absl::FailedPreconditionError(message);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) return ReadError(path, errno);
  std::string contents;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0) contents.append(buffer, n);
  // A directory opens fine on Linux and fails here, with EISDIR.
  if (std::ferror(file.get())) return ReadError(path, errno);
  return contents;
}

// Sets every unset singular field to its default, descending into every singular message
// field (creating it). Unset members of a oneof stay unset: setting them would clear the set
// one. The config schemas are trees, so the recursion ends.
void FillDefaults(Message* message) {
  const Descriptor* descriptor = message->GetDescriptor();
  const Reflection* reflection = message->GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated()) continue;
    const bool has = reflection->HasField(*message, field);
    if (!has && field->real_containing_oneof() != nullptr) continue;
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      FillDefaults(reflection->MutableMessage(message, field));
      continue;
    }
    if (has) continue;
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        reflection->SetInt32(message, field, field->default_value_int32());
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        reflection->SetInt64(message, field, field->default_value_int64());
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        reflection->SetUInt32(message, field, field->default_value_uint32());
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        reflection->SetUInt64(message, field, field->default_value_uint64());
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        reflection->SetFloat(message, field, field->default_value_float());
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        reflection->SetDouble(message, field, field->default_value_double());
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        reflection->SetBool(message, field, field->default_value_bool());
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        reflection->SetEnum(message, field, field->default_value_enum());
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        reflection->SetString(message, field, field->default_value_string());
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        break;  // handled above
    }
  }
}

}  // namespace

absl::StatusOr<TrainConfig> LoadTrainConfig(const std::string& path,
                                            const std::vector<std::string>& overrides) {
  NF_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  TrainConfig config;
  NF_RETURN_IF_ERROR(model::ParseTextProto(text, path, config));
  for (const std::string& override_text : overrides) {
    NF_RETURN_IF_ERROR(ApplyOverride(override_text, &config));
  }
  NF_RETURN_IF_ERROR(ValidateTrainConfig(config));
  return config;
}

std::string ResolvedConfigText(const TrainConfig& config) {
  TrainConfig resolved = config;
  // The older spelling, written out as what it means.
  if (resolved.train().activation_recompute()) {
    resolved.mutable_train()->set_activation_recompute(false);
    resolved.mutable_train()->set_recompute(TrainOptions::FULL);
  }
  FillDefaults(&resolved);
  std::string text;
  google::protobuf::TextFormat::PrintToString(resolved, &text);
  return text;
}

}  // namespace nf::launcher
