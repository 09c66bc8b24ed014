#include "generate/prompts.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/json_value.h"

namespace nf::generate {

absl::StatusOr<std::vector<std::string>> ReadPromptFile(const std::string& path) {
  // A directory opens as a stream that reads nothing: it would be a file of no prompts.
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt file ", path, " is a directory: give a file of prompts"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the prompt file ", path));
  std::vector<std::string> lines;
  bool jsonl = true;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    jsonl = jsonl && line.front() == '{';
    lines.push_back(std::move(line));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read the prompt file ", path));
  if (lines.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt file ", path, " holds no prompt (every line is empty)"));
  }
  if (!jsonl) return lines;
  std::vector<std::string> prompts;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto value = ParseJson(lines[i]);
    const std::string where = absl::StrCat(path, ": prompt ", i + 1);
    if (!value.ok())
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", value.status().message()));
    const JsonValue* field = nullptr;
    for (const char* name : {"prompt", "text"}) {
      const auto it = value->members.find(name);
      if (field == nullptr && it != value->members.end()) field = &it->second;
    }
    if (field == nullptr || field->kind != JsonValue::Kind::kString) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": a JSON line needs a \"prompt\" (or \"text\") string"));
    }
    prompts.push_back(field->text);
  }
  return prompts;
}

}  // namespace nf::generate
