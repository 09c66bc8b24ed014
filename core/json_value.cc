#include "core/json_value.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"

namespace nf {
namespace {

constexpr int kMaxDepth = 64;

// The value at `cursor` into *out (when not null), `depth` containers down.
absl::Status ReadValue(JsonCursor& cursor, JsonValue* out, int depth) {
  if (depth > kMaxDepth) return cursor.Error("nested deeper than 64 levels");
  // The kind is known from the first character: *out's, when there is one.
  const auto of_kind = [out](JsonValue::Kind kind) {
    if (out != nullptr) out->kind = kind;
    return out;
  };
  cursor.SkipSpace();
  if (cursor.AtEnd()) return cursor.Error("expected a value, found the end of the text");
  const char c = cursor.Peek();
  if (c == '{') {
    JsonValue* object = of_kind(JsonValue::Kind::kObject);
    return cursor.ReadObject([&](std::string name, size_t) -> absl::Status {
      if (object == nullptr) return ReadValue(cursor, nullptr, depth + 1);
      JsonValue& member = object->members[std::move(name)];
      member = JsonValue();  // a repeated key: the last value, not a merge with the first
      return ReadValue(cursor, &member, depth + 1);
    });
  }
  if (c == '[') {
    JsonValue* array = of_kind(JsonValue::Kind::kArray);
    return cursor.ReadArray([&] {
      return ReadValue(cursor, array != nullptr ? &array->items.emplace_back() : nullptr,
                       depth + 1);
    });
  }
  if (c == '"') {
    JsonValue* string_value = of_kind(JsonValue::Kind::kString);
    return cursor.ReadString(string_value != nullptr ? &string_value->text : nullptr);
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    NF_ASSIGN_OR_RETURN(const absl::string_view literal, cursor.ReadNumber());
    if (JsonValue* number = of_kind(JsonValue::Kind::kNumber); number != nullptr) {
      number->text = std::string(literal);
      number->number = std::strtod(number->text.c_str(), nullptr);
    }
    return absl::OkStatus();
  }
  for (const bool boolean : {true, false}) {
    if (cursor.ConsumeWord(boolean ? "true" : "false")) {
      if (JsonValue* value = of_kind(JsonValue::Kind::kBool); value != nullptr) {
        value->boolean = boolean;
      }
      return absl::OkStatus();
    }
  }
  if (cursor.ConsumeWord("null")) {
    of_kind(JsonValue::Kind::kNull);
    return absl::OkStatus();
  }
  return cursor.Error(
      absl::StrCat("unexpected character '", absl::CHexEscape(absl::string_view(&c, 1)), "'"));
}

}  // namespace

absl::StatusOr<JsonValue> ParseJson(absl::string_view line) {
  JsonCursor cursor(line);
  JsonValue value;
  NF_RETURN_IF_ERROR(ReadJsonValue(cursor, &value));
  cursor.SkipSpace();
  if (!cursor.AtEnd()) return cursor.Error("unexpected text after the value");
  return value;
}

absl::Status ReadJsonValue(JsonCursor& cursor, JsonValue* out) { return ReadValue(cursor, out, 0); }

absl::string_view JsonKindName(JsonValue::Kind kind) {
  switch (kind) {
    case JsonValue::Kind::kNull:
      return "null";
    case JsonValue::Kind::kBool:
      return "a boolean";
    case JsonValue::Kind::kNumber:
      return "a number";
    case JsonValue::Kind::kString:
      return "a string";
    case JsonValue::Kind::kArray:
      return "an array";
    case JsonValue::Kind::kObject:
      return "an object";
  }
  return "?";
}

std::string JsonQuoted(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
      continue;
    }
    out += c;
  }
  out += '"';
  return out;
}

}  // namespace nf
