// Reads documents from nf-preprocess's inputs, streaming: JSONL (one JSON object per line, the
// text in a configurable string field), plain text with one document per line, or plain text
// with documents separated by blank lines. "-" reads standard input.
#pragma once

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace nf::data {

enum class InputFormat { kJsonl, kLines, kParagraphs };

// "jsonl", "lines", "paragraphs"; InvalidArgument naming the value otherwise.
absl::StatusOr<InputFormat> ParseInputFormat(absl::string_view name);

// The string value of `key` in the JSON object `line` (nullopt when the object lacks it).
// InvalidArgument "column C: what" on the first syntax error, or a non-string value under `key`.
absl::StatusOr<std::optional<std::string>> JsonStringField(absl::string_view line,
                                                           absl::string_view key);

class DocumentReader {
 public:
  // NotFound naming the path when it cannot be opened. `keep_empty`: see Next().
  static absl::StatusOr<std::unique_ptr<DocumentReader>> Open(const std::string& path,
                                                              InputFormat format,
                                                              std::string json_key,
                                                              bool keep_empty = false);
  ~DocumentReader();

  // The next document, nullopt at the end of the input. Errors name the file and line.
  // Empty documents (a blank line of the lines format: empty or only spaces and tabs; an empty
  // JSONL text) are skipped, or with `keep_empty` returned as "" (a blank line of JSONL is never
  // a document, and in the paragraphs format blank lines only separate documents).
  absl::StatusOr<std::optional<std::string>> Next();
  // Bytes consumed so far (for progress).
  int64_t bytes_read() const { return bytes_read_; }

 private:
  DocumentReader(std::string path, FILE* file, bool owned, InputFormat format,
                 std::string json_key);
  // The next line into `line` (without its line end): false at the end of the input,
  // Unavailable naming the file and the OS's reason when reading fails.
  absl::StatusOr<bool> ReadLine(std::string& line);

  std::string path_;
  FILE* file_;
  bool owned_;
  InputFormat format_;
  std::string json_key_;
  bool keep_empty_ = false;
  int64_t line_number_ = 0;
  int64_t bytes_read_ = 0;
};

}  // namespace nf::data
