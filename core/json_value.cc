#include "eval/json_value.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace nf::eval {
namespace {

constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> Document() {
    JsonValue value;
    if (absl::Status s = Value(0, value); !s.ok()) return s;
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the value");
    return value;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("column ", pos_ + 1, ": ", what));
  }
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\n')) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool ConsumeWord(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::Status Value(int depth, JsonValue& out) {
    if (depth > kMaxDepth) return Error("nested deeper than 64 levels");
    SkipSpace();
    if (pos_ >= text_.size()) return Error("expected a value, found the end of the line");
    const char c = text_[pos_];
    if (c == '{') return Object(depth, out);
    if (c == '[') return Array(depth, out);
    if (c == '"') {
      out.kind = JsonValue::Kind::kString;
      return String(out.text);
    }
    for (const bool boolean : {true, false}) {
      if (ConsumeWord(boolean ? "true" : "false")) {
        out.kind = JsonValue::Kind::kBool;
        out.boolean = boolean;
        return absl::OkStatus();
      }
    }
    if (ConsumeWord("null")) {
      out.kind = JsonValue::Kind::kNull;
      return absl::OkStatus();
    }
    if (c == '-' || (c >= '0' && c <= '9')) return Number(out);
    return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  absl::Status Object(int depth, JsonValue& out) {
    out.kind = JsonValue::Kind::kObject;
    ++pos_;  // '{'
    SkipSpace();
    if (Consume('}')) return absl::OkStatus();
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Error("expected a member name");
      std::string name;
      if (absl::Status s = String(name); !s.ok()) return s;
      SkipSpace();
      if (!Consume(':')) return Error("expected ':' after a member name");
      JsonValue member;
      if (absl::Status s = Value(depth + 1, member); !s.ok()) return s;
      out.members[std::move(name)] = std::move(member);
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume('}')) return absl::OkStatus();
      return Error("expected ',' or '}' after a member");
    }
  }

  absl::Status Array(int depth, JsonValue& out) {
    out.kind = JsonValue::Kind::kArray;
    ++pos_;  // '['
    SkipSpace();
    if (Consume(']')) return absl::OkStatus();
    while (true) {
      JsonValue item;
      if (absl::Status s = Value(depth + 1, item); !s.ok()) return s;
      out.items.push_back(std::move(item));
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume(']')) return absl::OkStatus();
      return Error("expected ',' or ']' after an array element");
    }
  }

  // RFC 8259's number grammar: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
  absl::Status Number(JsonValue& out) {
    const size_t start = pos_;
    const auto digits = [&] {
      const size_t first = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ > first;
    };
    Consume('-');
    if (!Consume('0') && !digits()) return Error("expected digits in a number");
    if (Consume('.') && !digits()) return Error("expected digits after '.' in a number");
    if (Consume('e') || Consume('E')) {
      if (!Consume('+')) Consume('-');
      if (!digits()) return Error("expected digits in a number's exponent");
    }
    out.kind = JsonValue::Kind::kNumber;
    out.text = std::string(text_.substr(start, pos_ - start));
    out.number = std::strtod(out.text.c_str(), nullptr);
    return absl::OkStatus();
  }

  absl::Status Hex4(uint32_t& code) {
    if (text_.size() - pos_ < 4) return Error("a \\u escape needs four hex digits");
    code = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      code <<= 4;
      if (h >= '0' && h <= '9') {
        code |= static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        code |= static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        code |= static_cast<uint32_t>(h - 'A' + 10);
      } else {
        return Error("a \\u escape needs four hex digits");
      }
    }
    return absl::OkStatus();
  }

  static void AppendUtf8(uint32_t code, std::string& out) {
    if (code < 0x80) {
      out.push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (code >> 6)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (code >> 12)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (code >> 18)));
      out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }

  absl::Status String(std::string& out) {
    ++pos_;  // '"'
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return absl::OkStatus();
      if (static_cast<unsigned char>(c) < 0x20) return Error("control character in a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) return Error("unterminated escape");
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
          uint32_t code = 0;
          if (absl::Status s = Hex4(code); !s.ok()) return s;
          if (code >= 0xDC00 && code <= 0xDFFF) return Error("a lone low surrogate");
          if (code >= 0xD800 && code <= 0xDBFF) {
            uint32_t low = 0;
            if (!ConsumeWord("\\u")) return Error("a high surrogate without its low surrogate");
            if (absl::Status s = Hex4(low); !s.ok()) return s;
            if (low < 0xDC00 || low > 0xDFFF) {
              return Error("a high surrogate without its low surrogate");
            }
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(code, out);
          break;
        }
        default:
          return Error(absl::StrCat("unknown escape '\\", std::string(1, e), "'"));
      }
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<JsonValue> ParseJson(absl::string_view line) { return Parser(line).Document(); }

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

}  // namespace nf::eval
