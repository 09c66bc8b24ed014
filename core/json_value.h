// A strict JSON reader for one line of a task file (JSON Lines): the whole value as a small
// tree, so that a task can read strings, integers and arrays of strings by field name. RFC 8259
// syntax (\uXXXX escapes with surrogate pairs decode to UTF-8); a syntax error is reported with
// its byte column, and nesting deeper than 64 levels is refused rather than recursed into.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace nf::eval {

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

// "string", "number", ...: for messages that say what a field holds instead.
absl::string_view JsonKindName(JsonValue::Kind kind);

}  // namespace nf::eval
