// The project's one reading of JSON's syntax (RFC 8259): a position in the text and the tokens
// at it (white space, strings with their escapes decoded, numbers, words), the loops that
// delimit objects and arrays, and the syntax errors, each naming its place. What values may
// stand where is the reader's business: core/json_value.h reads any value into a tree; the
// vocabulary, safetensors header and JSONL readers allow only their own shapes, so that a
// wrong file is refused with the place of the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace nf {

// How a syntax error names its place, as the reader's users count places.
enum class JsonPlaces {
  kColumn,         // "column C": one line of JSON Lines (C 1-based, in bytes)
  kLineAndColumn,  // "<source>:L:C": a file (both 1-based, the column in bytes)
  kByte,           // "<source> byte B": JSON inside a binary file (B 0-based)
};

class JsonCursor {
 public:
  explicit JsonCursor(absl::string_view text, JsonPlaces places = JsonPlaces::kColumn,
                      absl::string_view source = "");

  size_t offset() const { return pos_; }
  bool AtEnd() const { return pos_ >= text_.size(); }
  // The next byte, '\0' at the end.
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  void SkipSpace();
  // Passes over `c` (or `word`) when it is next.
  bool Consume(char c);
  bool ConsumeWord(absl::string_view word);

  // The string whose opening quote is next, its escapes decoded (\uXXXX, surrogate pairs
  // joined, as UTF-8), appended to *out; only checked when `out` is null. Other bytes are
  // copied as they are.
  absl::Status ReadString(std::string* out);
  // The number next ('-' or a digit), as written, after checking RFC 8259's grammar: -?(0 |
  // [1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  absl::StatusOr<absl::string_view> ReadNumber();

  // The object next ('{'): for each member, `read_value(name, name_offset)` with the cursor at
  // the member's value, which it must read (or pass over).
  absl::Status ReadObject(
      absl::FunctionRef<absl::Status(std::string name, size_t name_offset)> read_value);
  // The array next ('['): `read_element()` with the cursor at each element, which it must read.
  absl::Status ReadArray(absl::FunctionRef<absl::Status()> read_element);

  // InvalidArgument "<place>: <what>" for the cursor's position, or for `offset`.
  absl::Status Error(absl::string_view what) const { return ErrorAt(pos_, what); }
  absl::Status ErrorAt(size_t offset, absl::string_view what) const;

 private:
  // After a backslash in a string: one escape, decoded into *out (when not null).
  absl::Status ReadEscape(std::string* out);
  // The four hex digits of a \u escape.
  absl::StatusOr<uint32_t> ReadHex4();
  // Passes over [0-9]*: whether there was one.
  bool SkipDigits();

  absl::string_view text_;
  JsonPlaces places_;
  absl::string_view source_;
  size_t pos_ = 0;
};

}  // namespace nf
