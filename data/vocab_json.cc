#include "data/vocab_json.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "data/unicode_class.h"

namespace nf::data {
namespace {

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

class Parser {
 public:
  Parser(absl::string_view text, absl::string_view file) : text_(text), file_(file) {}

  absl::StatusOr<absl::flat_hash_map<std::string, int32_t>> Object() {
    absl::flat_hash_map<std::string, int32_t> vocab;
    SkipSpace();
    if (!Consume('{')) return Error("expected '{': the vocabulary must be one JSON object");
    SkipSpace();
    if (!Consume('}')) {
      while (true) {
        SkipSpace();
        const size_t key_pos = pos_;
        std::string key;
        if (absl::Status s = String(key); !s.ok()) return s;
        SkipSpace();
        if (!Consume(':')) return Error("expected ':' after the key");
        SkipSpace();
        absl::StatusOr<int32_t> id = Id();
        if (!id.ok()) return id.status();
        if (!vocab.emplace(key, *id).second) {
          pos_ = key_pos;
          return Error(absl::StrCat("duplicate key \"", absl::CHexEscape(key), "\""));
        }
        SkipSpace();
        if (Consume(',')) continue;
        if (Consume('}')) break;
        return Error("expected ',' or '}' after a member");
      }
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the object");
    return vocab;
  }

 private:
  // "<file>:<line>:<column>: <what>" for the current position.
  absl::Status Error(absl::string_view what) const {
    size_t line = 1, line_start = 0;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') ++line, line_start = i + 1;
    }
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ":", line, ":", pos_ - line_start + 1, ": ", what));
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  bool Consume(char c) {
    if (AtEnd() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (!AtEnd() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                        text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  // A JSON integer -?(0|[1-9][0-9]*) in [0, 2^31): ids index int32 token arrays.
  absl::StatusOr<int32_t> Id() {
    const size_t start = pos_;
    const bool negative = Consume('-');
    if (AtEnd() || text_[pos_] < '0' || text_[pos_] > '9') return Error("expected an integer id");
    if (text_[pos_] == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' &&
        text_[pos_ + 1] <= '9') {
      return Error("leading zero in a number");
    }
    int64_t value = 0;
    while (!AtEnd() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      // Saturate: anything past int32 is rejected below, so no overflow is possible.
      value = std::min<int64_t>(value * 10 + (text_[pos_++] - '0'), int64_t{1} << 40);
    }
    if (!AtEnd() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      return Error("ids must be integers");
    }
    if (negative || value > std::numeric_limits<int32_t>::max()) {
      const absl::string_view literal = text_.substr(start, pos_ - start);
      pos_ = start;
      return Error(absl::StrCat("id ", literal, " is outside [0, 2^31)"));
    }
    return static_cast<int32_t>(value);
  }

  absl::StatusOr<uint32_t> Hex4() {
    if (text_.size() - pos_ < 4) return Error("truncated \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const char c = text_[pos_];
      const int digit = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
      if (digit < 0) return Error("expected 4 hex digits after \\u");
      value = value << 4 | digit;
    }
    return value;
  }

  // The code point of a \u escape whose 'u' was consumed, joining a surrogate pair.
  absl::StatusOr<uint32_t> UnicodeEscape() {
    absl::StatusOr<uint32_t> high = Hex4();
    if (!high.ok() || *high < 0xD800 || *high > 0xDFFF) return high;
    if (*high >= 0xDC00) return Error("unpaired low surrogate in a \\u escape");
    if (!Consume('\\') || !Consume('u')) return Error("high surrogate without its low surrogate");
    absl::StatusOr<uint32_t> low = Hex4();
    if (!low.ok()) return low;
    if (*low < 0xDC00 || *low > 0xDFFF) return Error("high surrogate without its low surrogate");
    return 0x10000 + ((*high - 0xD800) << 10) + (*low - 0xDC00);
  }

  absl::Status String(std::string& out) {
    if (!Consume('"')) return Error("expected a string key");
    while (true) {
      if (AtEnd()) return Error("unterminated string");
      const unsigned char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c < 0x20) return Error("control character in a string (must be escaped)");
      if (c >= 0x80) {
        // Raw non-ASCII text must be well-formed UTF-8; copy the whole character.
        const Utf8Char ch = NextUtf8Char(text_, pos_);
        if (ch.length == 1) return Error("invalid UTF-8");
        out.append(text_.data() + pos_, ch.length);
        pos_ += ch.length;
        continue;
      }
      ++pos_;
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        continue;
      }
      if (AtEnd()) return Error("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          absl::StatusOr<uint32_t> code_point = UnicodeEscape();
          if (!code_point.ok()) return code_point.status();
          AppendUtf8(*code_point, out);
          break;
        }
        default:
          --pos_;
          return Error(
              absl::StrCat("unknown escape \\", absl::CHexEscape(absl::string_view(&e, 1))));
      }
    }
  }

  absl::string_view text_;
  absl::string_view file_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<absl::flat_hash_map<std::string, int32_t>> ParseVocabJson(absl::string_view json,
                                                                         absl::string_view file) {
  return Parser(json, file).Object();
}

}  // namespace nf::data
