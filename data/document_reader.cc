#include "data/document_reader.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace nf::data {
namespace {

// A line of nothing but spaces and tabs: a separator, never a document.
bool IsBlank(absl::string_view line) { return line.find_first_not_of(" \t") == line.npos; }

// A strict, allocation-light JSON scanner over one line: enough to find one string field of
// an object and skip every other value.
class JsonScanner {
 public:
  explicit JsonScanner(absl::string_view text) : text_(text) {}

  absl::StatusOr<std::optional<std::string>> FindField(absl::string_view key) {
    SkipSpace();
    if (!Consume('{')) return Error("expected '{' at the start of the object");
    std::optional<std::string> found;
    SkipSpace();
    if (Consume('}')) return Finish(found);
    while (true) {
      SkipSpace();
      std::string name;
      if (absl::Status s = String(&name); !s.ok()) return s;
      SkipSpace();
      if (!Consume(':')) return Error("expected ':' after a member name");
      SkipSpace();
      if (name == key) {
        if (Peek() != '"') return Error(absl::StrCat("field \"", key, "\" is not a string"));
        std::string value;
        if (absl::Status s = String(&value); !s.ok()) return s;
        found = std::move(value);
      } else if (absl::Status s = SkipValue(0); !s.ok()) {
        return s;
      }
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume('}')) return Finish(found);
      return Error("expected ',' or '}' after a member");
    }
  }

 private:
  static constexpr int kMaxDepth = 64;

  absl::StatusOr<std::optional<std::string>> Finish(std::optional<std::string>& found) {
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the object");
    return std::move(found);
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON at byte ", pos_, ": ", what));
  }
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool Consume(char c) {
    if (Peek() != c || pos_ >= text_.size()) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (pos_ < text_.size() && std::strchr(" \t\r\n", text_[pos_]) != nullptr) ++pos_;
  }

  static void AppendUtf8(uint32_t code, std::string* out) {
    if (code < 0x80) {
      out->push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (code >> 6)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (code >> 12)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (code >> 18)));
      out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }

  absl::StatusOr<uint32_t> Hex4() {
    if (pos_ + 4 > text_.size()) return Error("truncated \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      value <<= 4;
      if (c >= '0' && c <= '9') value |= c - '0';
      else if (c >= 'a' && c <= 'f') value |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') value |= c - 'A' + 10;
      else return Error("bad hex digit in \\u escape");
    }
    return value;
  }

  // A JSON string into *out (nullptr: skip), with escapes and surrogate pairs decoded.
  absl::Status String(std::string* out) {
    if (!Consume('"')) return Error("expected a string");
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return absl::OkStatus();
      if (static_cast<unsigned char>(c) < 0x20) return Error("control character in a string");
      if (c != '\\') {
        if (out) out->push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) return Error("unterminated escape");
      const char e = text_[pos_++];
      const char* simple = std::strchr("\"\\/bfnrt", e);
      if (simple != nullptr && e != '\0') {
        static constexpr char kDecoded[] = "\"\\/\b\f\n\r\t";
        if (out) out->push_back(kDecoded[simple - "\"\\/bfnrt"]);
        continue;
      }
      if (e != 'u') return Error("unknown escape");
      auto code = Hex4();
      if (!code.ok()) return code.status();
      uint32_t cp = *code;
      if (cp >= 0xD800 && cp < 0xDC00) {  // a high surrogate must pair with a low one
        if (!(Consume('\\') && Consume('u'))) return Error("unpaired surrogate");
        auto low = Hex4();
        if (!low.ok()) return low.status();
        if (*low < 0xDC00 || *low >= 0xE000) return Error("unpaired surrogate");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (*low - 0xDC00);
      } else if (cp >= 0xDC00 && cp < 0xE000) {
        return Error("unpaired surrogate");
      }
      if (out) AppendUtf8(cp, out);
    }
  }

  absl::Status SkipValue(int depth) {
    if (depth > kMaxDepth) return Error("nesting deeper than 64");
    SkipSpace();
    const char c = Peek();
    if (c == '"') return String(nullptr);
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++pos_;
      SkipSpace();
      if (Consume(close)) return absl::OkStatus();
      while (true) {
        SkipSpace();
        if (c == '{') {
          if (absl::Status s = String(nullptr); !s.ok()) return s;
          SkipSpace();
          if (!Consume(':')) return Error("expected ':' after a member name");
        }
        if (absl::Status s = SkipValue(depth + 1); !s.ok()) return s;
        SkipSpace();
        if (Consume(',')) continue;
        if (Consume(close)) return absl::OkStatus();
        return Error("expected ',' or a closing bracket");
      }
    }
    for (absl::string_view literal : {"true", "false", "null"}) {
      if (text_.substr(pos_, literal.size()) == literal) {
        pos_ += literal.size();
        return absl::OkStatus();
      }
    }
    // A number: -?digits[.digits][(e|E)[+-]digits]
    const size_t start = pos_;
    Consume('-');
    auto digits = [&] {
      const size_t before = pos_;
      while (Peek() >= '0' && Peek() <= '9') ++pos_;
      return pos_ > before;
    };
    if (!digits()) return Error("expected a value");
    if (Consume('.') && !digits()) return Error("bad number");
    if ((Consume('e') || Consume('E'))) {
      if (!Consume('+')) Consume('-');
      if (!digits()) return Error("bad number");
    }
    return pos_ > start ? absl::OkStatus() : Error("expected a value");
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<InputFormat> ParseInputFormat(absl::string_view name) {
  if (name == "jsonl") return InputFormat::kJsonl;
  if (name == "lines") return InputFormat::kLines;
  if (name == "paragraphs") return InputFormat::kParagraphs;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown input format '", name, "'; use jsonl, lines or paragraphs"));
}

absl::StatusOr<std::optional<std::string>> JsonStringField(absl::string_view line,
                                                           absl::string_view key) {
  return JsonScanner(line).FindField(key);
}

absl::StatusOr<std::unique_ptr<DocumentReader>> DocumentReader::Open(const std::string& path,
                                                                     InputFormat format,
                                                                     std::string json_key,
                                                                     bool keep_empty) {
  if (path == "-") {
    std::unique_ptr<DocumentReader> reader(
        new DocumentReader("<stdin>", stdin, false, format, std::move(json_key)));
    reader->keep_empty_ = keep_empty;
    return reader;
  }
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input ", path, " is a directory: give the files in it (e.g. ", path, "/*.jsonl)"));
  }
  FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot open input ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<DocumentReader> reader(
      new DocumentReader(path, file, true, format, std::move(json_key)));
  reader->keep_empty_ = keep_empty;
  return reader;
}

DocumentReader::DocumentReader(std::string path, FILE* file, bool owned, InputFormat format,
                               std::string json_key)
    : path_(std::move(path)),
      file_(file),
      owned_(owned),
      format_(format),
      json_key_(std::move(json_key)) {}

DocumentReader::~DocumentReader() {
  if (owned_) std::fclose(file_);
}

absl::StatusOr<bool> DocumentReader::ReadLine(std::string& line) {
  // POSIX getline: buffered and lock-free per call, unlike a loop of fgetc.
  char* buffer = nullptr;
  size_t capacity = 0;
  errno = 0;
  const ssize_t length = getline(&buffer, &capacity, file_);
  if (length < 0) {
    const int reason = errno;
    std::free(buffer);
    // The end of the input, or an error reading it (never taken for the end).
    if (!std::ferror(file_)) return false;
    return absl::UnavailableError(absl::StrCat("cannot read input ", path_, " after line ",
                                               line_number_, ": ", std::strerror(reason)));
  }
  bytes_read_ += length;
  ++line_number_;
  line.assign(buffer, static_cast<size_t>(length));
  std::free(buffer);
  if (!line.empty() && line.back() == '\n') line.pop_back();
  if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF files
  return true;
}

absl::StatusOr<std::optional<std::string>> DocumentReader::Next() {
  std::string line;
  switch (format_) {
    case InputFormat::kLines:
      for (;;) {
        NF_ASSIGN_OR_RETURN(const bool more, ReadLine(line));
        if (!more) return std::nullopt;
        if (!IsBlank(line)) return std::optional<std::string>(std::move(line));
        if (keep_empty_) return std::optional<std::string>("");
      }
    case InputFormat::kParagraphs: {
      std::string document;
      for (;;) {
        NF_ASSIGN_OR_RETURN(const bool more, ReadLine(line));
        if (!more) break;
        if (IsBlank(line)) {
          if (!document.empty()) return std::optional<std::string>(std::move(document));
          continue;
        }
        if (!document.empty()) document.push_back('\n');
        document += line;
      }
      if (!document.empty()) return std::optional<std::string>(std::move(document));
      return std::nullopt;
    }
    case InputFormat::kJsonl:
      for (;;) {
        NF_ASSIGN_OR_RETURN(const bool more, ReadLine(line));
        if (!more) return std::nullopt;
        if (IsBlank(line)) continue;
        auto field = JsonStringField(line, json_key_);
        if (!field.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path_, ":", line_number_, ": ", field.status().message()));
        }
        if (!field->has_value()) {
          return absl::InvalidArgumentError(absl::StrCat(
              path_, ":", line_number_, ": no \"", json_key_,
              "\" string field (choose the field with --json-key)"));
        }
        if (!(*field)->empty() || keep_empty_) return std::move(*field);
      }
  }
  return std::nullopt;
}

}  // namespace nf::data
