#include "data/document_reader.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/json_cursor.h"
#include "core/json_value.h"
#include "core/status.h"

namespace nf::data {
namespace {

// A line of nothing but spaces and tabs: a separator, never a document.
bool IsBlank(absl::string_view line) { return line.find_first_not_of(" \t") == line.npos; }

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
  // The other members are checked as strictly but passed over, not built into a tree: this is
  // nf-preprocess's reading loop.
  JsonCursor cursor(line);
  cursor.SkipSpace();
  if (cursor.Peek() != '{') return cursor.Error("expected '{' at the start of the object");
  std::optional<std::string> text;
  NF_RETURN_IF_ERROR(cursor.ReadObject([&](std::string name, size_t) -> absl::Status {
    if (name != key) return ReadJsonValue(cursor, nullptr);
    if (cursor.Peek() != '"')
      return cursor.Error(absl::StrCat("field \"", key, "\" is not a string"));
    text.emplace();  // a repeated key: the last one's text
    return cursor.ReadString(&*text);
  }));
  cursor.SkipSpace();
  if (!cursor.AtEnd()) return cursor.Error("unexpected text after the object");
  return text;
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
          return absl::InvalidArgumentError(
              absl::StrCat(path_, ":", line_number_, ": no \"", json_key_,
                           "\" string field (choose the field with --json-key)"));
        }
        if (!(*field)->empty() || keep_empty_) return std::move(*field);
      }
  }
  return std::nullopt;
}

}  // namespace nf::data
