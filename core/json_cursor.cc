#include "core/json_cursor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace nf {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// A byte a string holds as it is: not its end, not an escape, not a control character (which
// must be escaped).
bool IsPlain(char c) { return c != '"' && c != '\\' && static_cast<unsigned char>(c) >= 0x20; }

void AppendUtf8(uint32_t code_point, std::string& out) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
    return;
  }
  const int length = code_point < 0x800 ? 2 : code_point < 0x10000 ? 3 : 4;
  static constexpr unsigned char kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  out.push_back(static_cast<char>(kLead[length] | (code_point >> (6 * (length - 1)))));
  for (int i = length - 2; i >= 0; --i) {
    out.push_back(static_cast<char>(0x80 | ((code_point >> (6 * i)) & 0x3F)));
  }
}

}  // namespace

JsonCursor::JsonCursor(absl::string_view text, JsonPlaces places, absl::string_view source)
    : text_(text), places_(places), source_(source) {}

void JsonCursor::SkipSpace() {
  while (!AtEnd() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                      text_[pos_] == '\r')) {
    ++pos_;
  }
}

bool JsonCursor::Consume(char c) {
  if (AtEnd() || text_[pos_] != c) return false;
  ++pos_;
  return true;
}

bool JsonCursor::ConsumeWord(absl::string_view word) {
  if (text_.substr(pos_, word.size()) != word) return false;
  pos_ += word.size();
  return true;
}

absl::Status JsonCursor::ErrorAt(size_t offset, absl::string_view what) const {
  switch (places_) {
    case JsonPlaces::kColumn:
      return absl::InvalidArgumentError(absl::StrCat("column ", offset + 1, ": ", what));
    case JsonPlaces::kLineAndColumn: {
      const absl::string_view before = text_.substr(0, offset);
      const size_t line_start = before.rfind('\n') + 1;  // 0 on the first line (npos + 1)
      const size_t line = std::count(before.begin(), before.end(), '\n') + 1;
      return absl::InvalidArgumentError(
          absl::StrCat(source_, ":", line, ":", offset - line_start + 1, ": ", what));
    }
    case JsonPlaces::kByte:
      return absl::InvalidArgumentError(absl::StrCat(source_, " byte ", offset, ": ", what));
  }
  return absl::InvalidArgumentError(what);
}

absl::Status JsonCursor::ReadString(std::string* out) {
  ++pos_;  // the opening quote
  while (true) {
    // Plain bytes in runs: most of a document's text, copied at once.
    const size_t run = pos_;
    while (!AtEnd() && IsPlain(text_[pos_])) ++pos_;
    if (out != nullptr) out->append(text_.data() + run, pos_ - run);
    if (AtEnd()) return Error("a string without its closing quote");
    const char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      return absl::OkStatus();
    }
    if (c != '\\') return Error("a control character in a string (must be escaped)");
    NF_RETURN_IF_ERROR(ReadEscape(out));
  }
}

absl::Status JsonCursor::ReadEscape(std::string* out) {
  const size_t start = pos_++;  // the backslash
  if (AtEnd()) return Error("a string without its closing quote");
  const char e = text_[pos_++];
  static constexpr absl::string_view kNames = "\"\\/bfnrt";
  static constexpr absl::string_view kDecoded = "\"\\/\b\f\n\r\t";
  if (const size_t simple = kNames.find(e); simple != kNames.npos) {
    if (out != nullptr) out->push_back(kDecoded[simple]);
    return absl::OkStatus();
  }
  if (e != 'u') {
    return ErrorAt(
        start, absl::StrCat("unknown escape '\\", absl::CHexEscape(absl::string_view(&e, 1)), "'"));
  }
  NF_ASSIGN_OR_RETURN(uint32_t code_point, ReadHex4());
  if (code_point >= 0xDC00 && code_point <= 0xDFFF) {
    return ErrorAt(start, "a lone surrogate: an unpaired low surrogate");
  }
  if (code_point >= 0xD800 && code_point <= 0xDBFF) {
    // UTF-16's pair for a code point past U+FFFF: the low half must follow at once.
    if (!ConsumeWord("\\u")) {
      return ErrorAt(start, "a lone surrogate: a high surrogate without its low surrogate");
    }
    NF_ASSIGN_OR_RETURN(const uint32_t low, ReadHex4());
    if (low < 0xDC00 || low > 0xDFFF) {
      return ErrorAt(start, "a lone surrogate: a high surrogate without its low surrogate");
    }
    code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
  }
  if (out != nullptr) AppendUtf8(code_point, *out);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> JsonCursor::ReadHex4() {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i, ++pos_) {
    const char c = Peek();
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
    if (digit < 0) return Error("a \\u escape needs four hex digits");
    value = value << 4 | static_cast<uint32_t>(digit);
  }
  return value;
}

bool JsonCursor::SkipDigits() {
  const size_t start = pos_;
  while (IsDigit(Peek())) ++pos_;
  return pos_ > start;
}

absl::StatusOr<absl::string_view> JsonCursor::ReadNumber() {
  const size_t start = pos_;
  Consume('-');
  if (Consume('0')) {
    // RFC 8259 would end the number here; "01" is far likelier a mistake than two tokens.
    if (IsDigit(Peek())) return ErrorAt(pos_ - 1, "a leading zero in a number");
  } else if (!SkipDigits()) {
    return Error("expected digits in a number");
  }
  if (Consume('.') && !SkipDigits()) return Error("expected digits after '.' in a number");
  if (Consume('e') || Consume('E')) {
    if (!Consume('+')) Consume('-');
    if (!SkipDigits()) return Error("expected digits in a number's exponent");
  }
  return text_.substr(start, pos_ - start);
}

absl::Status JsonCursor::ReadObject(
    absl::FunctionRef<absl::Status(std::string name, size_t name_offset)> read_value) {
  ++pos_;  // '{'
  SkipSpace();
  if (Consume('}')) return absl::OkStatus();
  while (true) {
    SkipSpace();
    const size_t name_offset = pos_;
    if (Peek() != '"') return Error("expected a string key");
    std::string name;
    NF_RETURN_IF_ERROR(ReadString(&name));
    SkipSpace();
    if (!Consume(':')) return Error("expected ':' after the key");
    SkipSpace();
    NF_RETURN_IF_ERROR(read_value(std::move(name), name_offset));
    SkipSpace();
    if (Consume(',')) continue;
    if (Consume('}')) return absl::OkStatus();
    return Error("expected ',' or '}' after a member");
  }
}

absl::Status JsonCursor::ReadArray(absl::FunctionRef<absl::Status()> read_element) {
  ++pos_;  // '['
  SkipSpace();
  if (Consume(']')) return absl::OkStatus();
  while (true) {
    SkipSpace();
    NF_RETURN_IF_ERROR(read_element());
    SkipSpace();
    if (Consume(',')) continue;
    if (Consume(']')) return absl::OkStatus();
    return Error("expected ',' or ']' after an array element");
  }
}

}  // namespace nf
