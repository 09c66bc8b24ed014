// The general JSON reader: any value as a small tree, so that a caller can read strings,
// numbers and arrays by field name (nf-eval's task files, nf-generate's prompt files). The
// syntax is core/json_cursor.h's (RFC 8259, strict); nesting deeper than 64 levels is refused
// rather than recursed into.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/json_cursor.h"

namespace nf {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string text;  // kString: the decoded UTF-8; kNumber: the literal as written
  std::vector<JsonValue> items;
  std::map<std::string, JsonValue> members;  // a repeated key keeps its last value
};

// The value `line` holds (surrounding spaces allowed, nothing else after it). InvalidArgument
// "column C: what" (C 1-based, in bytes) on a syntax error.
absl::StatusOr<JsonValue> ParseJson(absl::string_view line);

// The value at `cursor` into *out, or only checked and passed over when `out` is null (a reader
// that wants one field of an object skips the others without building them).
absl::Status ReadJsonValue(JsonCursor& cursor, JsonValue* out);

// `text` as a JSON string literal, quotes included: '"' and '\\' escaped, control characters as
// \u00XX, every other byte as it is (UTF-8 passes through).
std::string JsonQuoted(absl::string_view text);

// "a string", "a number", ...: for messages that say what a field holds instead.
absl::string_view JsonKindName(JsonValue::Kind kind);

}  // namespace nf
