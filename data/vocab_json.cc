#include "data/vocab_json.h"

#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/json_cursor.h"
#include "core/status.h"
#include "data/unicode_class.h"

namespace nf::data {
namespace {

// Whether `text` is well-formed UTF-8: a token is text, and a damaged file must not make one
// of stray bytes.
bool IsUtf8(absl::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Char c = NextUtf8Char(text, pos);
    if (c.length == 1 && static_cast<unsigned char>(text[pos]) >= 0x80) return false;
    pos += c.length;
  }
  return true;
}

// The id at `cursor`: a JSON integer in [0, 2^31), as ids index int32 token arrays.
absl::StatusOr<int32_t> ReadId(JsonCursor& cursor) {
  const size_t start = cursor.offset();
  const char c = cursor.Peek();
  if (c != '-' && (c < '0' || c > '9')) return cursor.Error("expected an integer id");
  NF_ASSIGN_OR_RETURN(const absl::string_view literal, cursor.ReadNumber());
  if (const size_t fraction = literal.find_first_of(".eE"); fraction != literal.npos) {
    return cursor.ErrorAt(start + fraction, "ids must be integers");
  }
  // "-0" too is refused; a literal too long for int64 fails to convert, out of range as well.
  int64_t id = 0;
  if (literal.front() == '-' || !absl::SimpleAtoi(literal, &id) ||
      id > std::numeric_limits<int32_t>::max()) {
    return cursor.ErrorAt(start, absl::StrCat("id ", literal, " is outside [0, 2^31)"));
  }
  return static_cast<int32_t>(id);
}

}  // namespace

absl::StatusOr<absl::flat_hash_map<std::string, int32_t>> ParseVocabJson(absl::string_view json,
                                                                         absl::string_view file) {
  JsonCursor cursor(json, JsonPlaces::kLineAndColumn, file);
  absl::flat_hash_map<std::string, int32_t> vocab;
  cursor.SkipSpace();
  if (cursor.Peek() != '{') {
    return cursor.Error("expected '{': the vocabulary must be one JSON object");
  }
  NF_RETURN_IF_ERROR(cursor.ReadObject([&](std::string key, size_t key_offset) -> absl::Status {
    if (!IsUtf8(key)) return cursor.ErrorAt(key_offset, "invalid UTF-8 in a key");
    NF_ASSIGN_OR_RETURN(const int32_t id, ReadId(cursor));
    const auto [it, inserted] = vocab.emplace(std::move(key), id);
    if (!inserted) {
      return cursor.ErrorAt(key_offset,
                            absl::StrCat("duplicate key \"", absl::CHexEscape(it->first), "\""));
    }
    return absl::OkStatus();
  }));
  cursor.SkipSpace();
  if (!cursor.AtEnd()) return cursor.Error("unexpected text after the object");
  return vocab;
}

}  // namespace nf::data
