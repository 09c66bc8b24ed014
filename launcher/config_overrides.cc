// `--set field.path=value`: one scalar field of a config message, found and set by reflection
// so that every field of every schema is reachable without a flag of its own.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "launcher/config.h"

namespace nf::launcher {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

std::string FieldNames(const Descriptor* descriptor) {
  std::vector<std::string> names;
  for (int i = 0; i < descriptor->field_count(); ++i) names.push_back(descriptor->field(i)->name());
  return absl::StrJoin(names, ", ");
}

std::string EnumValueNames(const EnumDescriptor* descriptor) {
  std::vector<std::string> names;
  for (int i = 0; i < descriptor->value_count(); ++i) names.push_back(descriptor->value(i)->name());
  return absl::StrJoin(names, ", ");
}

// "int32", "nf.model.NormFormerConfig", "nf.launcher.TrainOptions.Precision": the field's
// type as a user would look it up.
std::string TypeName(const FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return field->message_type()->full_name();
    case FieldDescriptor::CPPTYPE_ENUM:
      return field->enum_type()->full_name();
    default:
      return field->cpp_type_name();
  }
}

// `text` without one leading '+' (a sign from_chars does not accept, but people write).
absl::string_view WithoutPlus(absl::string_view text) {
  if (text.size() > 1 && text[0] == '+' && text[1] != '-') text.remove_prefix(1);
  return text;
}

// Parses all of `text` as a decimal integer of type T. On failure returns a reason that
// completes "'VALUE' ..." (e.g. "is not a decimal int32").
template <typename T>
absl::StatusOr<T> ParseInteger(absl::string_view text, absl::string_view type_name) {
  text = WithoutPlus(text);
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range) {
    return absl::InvalidArgumentError(absl::StrCat("is out of range for ", type_name, " [",
                                                   std::numeric_limits<T>::min(), ", ",
                                                   std::numeric_limits<T>::max(), "]"));
  }
  if (error != std::errc() || end != text.data() + text.size()) {
    return absl::InvalidArgumentError(absl::StrCat("is not a decimal ", type_name));
  }
  return value;
}

// Parses all of `text` as a finite number representable in T (float or double).
template <typename T>
absl::StatusOr<T> ParseFloating(absl::string_view text, absl::string_view type_name) {
  text = WithoutPlus(text);
  double value = 0.0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (end != text.data() + text.size() ||
      (error != std::errc() && error != std::errc::result_out_of_range) ||
      (error == std::errc() && !std::isfinite(value))) {
    return absl::InvalidArgumentError(absl::StrCat("is not a finite ", type_name));
  }
  // Too large, or so small that it would silently become 0.
  if (error == std::errc::result_out_of_range || std::abs(value) > std::numeric_limits<T>::max() ||
      (value != 0 && static_cast<T>(value) == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("is out of range for ", type_name));
  }
  return static_cast<T>(value);
}

absl::StatusOr<bool> ParseBool(absl::string_view text) {
  if (text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  return absl::InvalidArgumentError("is not a bool (true, false, 1 or 0)");
}

// Sets the singular scalar `field` of `message` from `text`; on failure the status message
// completes "'TEXT' ...".
absl::Status SetScalar(Message* message, const FieldDescriptor* field, absl::string_view text) {
  const Reflection* reflection = message->GetReflection();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      const absl::StatusOr<int32_t> value = ParseInteger<int32_t>(text, "int32");
      if (!value.ok()) return value.status();
      reflection->SetInt32(message, field, *value);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      const absl::StatusOr<int64_t> value = ParseInteger<int64_t>(text, "int64");
      if (!value.ok()) return value.status();
      reflection->SetInt64(message, field, *value);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      const absl::StatusOr<uint32_t> value = ParseInteger<uint32_t>(text, "uint32");
      if (!value.ok()) return value.status();
      reflection->SetUInt32(message, field, *value);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      const absl::StatusOr<uint64_t> value = ParseInteger<uint64_t>(text, "uint64");
      if (!value.ok()) return value.status();
      reflection->SetUInt64(message, field, *value);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const absl::StatusOr<float> value = ParseFloating<float>(text, "float");
      if (!value.ok()) return value.status();
      reflection->SetFloat(message, field, *value);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      const absl::StatusOr<double> value = ParseFloating<double>(text, "double");
      if (!value.ok()) return value.status();
      reflection->SetDouble(message, field, *value);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      const absl::StatusOr<bool> value = ParseBool(text);
      if (!value.ok()) return value.status();
      reflection->SetBool(message, field, *value);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const EnumDescriptor* type = field->enum_type();
      const google::protobuf::EnumValueDescriptor* value = type->FindValueByName(std::string(text));
      if (value == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("is not a value of ", type->full_name(),
                                                       " (values: ", EnumValueNames(type), ")"));
      }
      reflection->SetEnum(message, field, value);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_STRING:
      reflection->SetString(message, field, std::string(text));
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;  // rejected by the caller
  }
  return absl::InternalError("not a scalar field");
}

}  // namespace

absl::Status ApplyOverride(const std::string& override_text, Message* message) {
  const auto error = [&override_text](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("--set ", override_text, ": ", what));
  };
  const size_t equals = override_text.find('=');
  if (equals == std::string::npos) {
    return error("expected field.path=value, e.g. --set train.optimizer.lr=6e-4");
  }
  const absl::string_view path = absl::string_view(override_text).substr(0, equals);
  const absl::string_view value = absl::string_view(override_text).substr(equals + 1);
  const std::vector<absl::string_view> names = absl::StrSplit(path, '.');

  // Resolve the path on const views and parse the value into a scratch message first, so that a
  // bad override leaves `message` untouched (no half-created sub-messages).
  std::vector<const FieldDescriptor*> fields;
  const Message* current = message;
  for (size_t i = 0; i < names.size(); ++i) {
    const Descriptor* descriptor = current->GetDescriptor();
    const std::string name(names[i]);
    const FieldDescriptor* field = descriptor->FindFieldByName(name);
    if (field == nullptr) {
      return error(absl::StrCat(name.empty() ? "empty field name" : "no field '" + name + "'",
                                " in ", descriptor->full_name(),
                                " (fields: ", FieldNames(descriptor), ")"));
    }
    if (field->is_repeated()) {
      return error(absl::StrCat("'", name, "' in ", descriptor->full_name(),
                                " is a repeated field; --set only sets singular fields"));
    }
    const bool is_message = field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (i + 1 < names.size() && !is_message) {
      return error(absl::StrCat("'", name, "' in ", descriptor->full_name(), " has type ",
                                TypeName(field), ", not a message with fields"));
    }
    if (i + 1 == names.size() && is_message) {
      return error(absl::StrCat(
          "'", name, "' is a message (", TypeName(field),
          "); set one of its fields instead (fields: ", FieldNames(field->message_type()), ")"));
    }
    fields.push_back(field);
    if (is_message) current = &current->GetReflection()->GetMessage(*current, field);
  }
  std::unique_ptr<Message> scratch(current->New());
  const absl::Status status = SetScalar(scratch.get(), fields.back(), value);
  if (!status.ok()) {
    // An enum's reason already names its type and lists its values.
    const bool is_enum = fields.back()->cpp_type() == FieldDescriptor::CPPTYPE_ENUM;
    return error(absl::StrCat("'", value, "' ", status.message(),
                              is_enum ? "" : absl::StrCat(" (", fields.back()->full_name(), ")")));
  }

  Message* target = message;
  for (size_t i = 0; i + 1 < fields.size(); ++i) {
    target = target->GetReflection()->MutableMessage(target, fields[i]);
  }
  // Parsed once already, so this cannot fail. (Setting rather than merging `scratch` also
  // covers proto3 fields, whose zero values a merge would skip.)
  return SetScalar(target, fields.back(), value);
}

}  // namespace nf::launcher
