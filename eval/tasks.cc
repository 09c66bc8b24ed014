#include "eval/tasks.h"

#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "core/status.h"

namespace nf::eval {
namespace {

absl::StatusOr<const JsonValue*> Field(const JsonValue& line, absl::string_view key,
                                       JsonValue::Kind kind) {
  if (line.kind != JsonValue::Kind::kObject) {
    return absl::InvalidArgumentError(
        absl::StrCat("a task line must be a JSON object, not ", JsonKindName(line.kind)));
  }
  const auto it = line.members.find(std::string(key));
  if (it == line.members.end()) {
    return absl::InvalidArgumentError(absl::StrCat("no \"", key, "\" field"));
  }
  if (it->second.kind != kind) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", key, "\" is ", JsonKindName(it->second.kind), ", not ", JsonKindName(kind)));
  }
  return &it->second;
}

absl::StatusOr<std::string> StringField(const JsonValue& line, absl::string_view key) {
  NF_ASSIGN_OR_RETURN(const JsonValue* value, Field(line, key, JsonValue::Kind::kString));
  return value->text;
}

// An integer label written as a JSON integer or a string of digits, as `first` + an index into
// `choices` choices: the index.
absl::StatusOr<int> LabelField(const JsonValue& line, absl::string_view key, int first,
                               int choices) {
  const auto it = line.members.find(std::string(key));
  if (it == line.members.end()) {
    return absl::InvalidArgumentError(absl::StrCat("no \"", key, "\" field"));
  }
  const JsonValue& value = it->second;
  int label = 0;
  const bool integer =
      (value.kind == JsonValue::Kind::kNumber || value.kind == JsonValue::Kind::kString) &&
      absl::SimpleAtoi(value.text, &label);
  if (!integer || label < first || label >= first + choices) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", key, "\" must be an integer from ", first, " to ", first + choices - 1));
  }
  return label - first;
}

// lm-evaluation-harness's HellaSwag clean-up of WikiHow markup.
std::string CleanHellaSwag(absl::string_view text) {
  std::string s = absl::StrReplaceAll(absl::StripAsciiWhitespace(text), {{" [title]", ". "}});
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '[') {
      const size_t close = s.find(']', i);
      if (close != std::string::npos) {
        i = close;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return absl::StrReplaceAll(out, {{"  ", " "}});
}

// Python's str.capitalize() on ASCII: the first character upper case, every other lower case
// ("then the Man" -> "Then the man"). Bytes outside ASCII are kept as they are, where Python
// would also change the case of non-ASCII letters.
std::string Capitalize(absl::string_view text) {
  std::string out = absl::AsciiStrToLower(text);
  if (!out.empty()) out[0] = absl::ascii_toupper(static_cast<unsigned char>(out[0]));
  return out;
}

// lm-evaluation-harness's context: ctx_a, a space and ctx_b capitalized, where the dataset's own
// "ctx" has ctx_b as it is (mostly lower case: "... smiles. then"); a line with only "ctx" is
// taken as it stands.
absl::StatusOr<std::string> HellaSwagContext(const JsonValue& line) {
  if (!line.members.contains("ctx_a")) return StringField(line, "ctx");
  NF_ASSIGN_OR_RETURN(const std::string a, StringField(line, "ctx_a"));
  NF_ASSIGN_OR_RETURN(const std::string b, StringField(line, "ctx_b"));
  return absl::StrCat(a, " ", Capitalize(b));
}

absl::StatusOr<TaskExample> HellaSwag(const JsonValue& line) {
  NF_ASSIGN_OR_RETURN(std::string context, HellaSwagContext(line));
  if (line.members.contains("activity_label")) {
    NF_ASSIGN_OR_RETURN(const std::string activity, StringField(line, "activity_label"));
    context = absl::StrCat(activity, ": ", context);
  }
  NF_ASSIGN_OR_RETURN(const JsonValue* endings, Field(line, "endings", JsonValue::Kind::kArray));
  if (endings->items.size() < 2) {
    return absl::InvalidArgumentError("\"endings\" must hold at least two strings");
  }
  TaskExample example;
  for (const JsonValue& ending : endings->items) {
    if (ending.kind != JsonValue::Kind::kString) {
      return absl::InvalidArgumentError("\"endings\" must hold strings only");
    }
    example.choices.push_back({.context = CleanHellaSwag(context),
                               .continuation = absl::StrCat(" ", CleanHellaSwag(ending.text))});
  }
  NF_ASSIGN_OR_RETURN(example.label,
                      LabelField(line, "label", 0, static_cast<int>(example.choices.size())));
  return example;
}

absl::StatusOr<TaskExample> Piqa(const JsonValue& line) {
  NF_ASSIGN_OR_RETURN(const std::string goal, StringField(line, "goal"));
  TaskExample example;
  for (const char* key : {"sol1", "sol2"}) {
    NF_ASSIGN_OR_RETURN(const std::string solution, StringField(line, key));
    example.choices.push_back({.context = absl::StrCat("Question: ", goal, "\nAnswer:"),
                               .continuation = absl::StrCat(" ", solution)});
  }
  NF_ASSIGN_OR_RETURN(example.label, LabelField(line, "label", 0, 2));
  return example;
}

absl::StatusOr<TaskExample> WinoGrande(const JsonValue& line) {
  NF_ASSIGN_OR_RETURN(const std::string sentence, StringField(line, "sentence"));
  const size_t blank = sentence.find('_');
  if (blank == std::string::npos || sentence.find('_', blank + 1) != std::string::npos) {
    return absl::InvalidArgumentError("\"sentence\" must hold exactly one '_'");
  }
  const std::string after =
      absl::StrCat(" ", absl::StripAsciiWhitespace(absl::string_view(sentence).substr(blank + 1)));
  TaskExample example;
  for (const char* key : {"option1", "option2"}) {
    NF_ASSIGN_OR_RETURN(const std::string option, StringField(line, key));
    example.choices.push_back(
        {.context = absl::StrCat(sentence.substr(0, blank), option), .continuation = after});
  }
  NF_ASSIGN_OR_RETURN(example.label, LabelField(line, "answer", 1, 2));
  return example;
}

absl::StatusOr<TaskExample> StoryCloze(const JsonValue& line) {
  std::vector<std::string> sentences;
  for (int i = 1; i <= 4; ++i) {
    NF_ASSIGN_OR_RETURN(std::string sentence,
                        StringField(line, absl::StrCat("input_sentence_", i)));
    sentences.push_back(std::move(sentence));
  }
  TaskExample example;
  for (const char* key : {"sentence_quiz1", "sentence_quiz2"}) {
    NF_ASSIGN_OR_RETURN(const std::string ending, StringField(line, key));
    example.choices.push_back(
        {.context = absl::StrJoin(sentences, " "), .continuation = absl::StrCat(" ", ending)});
  }
  NF_ASSIGN_OR_RETURN(example.label, LabelField(line, "answer_right_ending", 1, 2));
  return example;
}

absl::StatusOr<TaskExample> Lambada(const JsonValue& line) {
  NF_ASSIGN_OR_RETURN(const std::string text, StringField(line, "text"));
  const size_t space = text.rfind(' ');
  if (space == std::string::npos || space == 0 || space + 1 == text.size()) {
    return absl::InvalidArgumentError(
        "\"text\" must be words separated by spaces, the last one the target");
  }
  TaskExample example;
  example.choices.push_back({.context = text.substr(0, space), .continuation = text.substr(space)});
  return example;
}

}  // namespace

absl::StatusOr<TaskKind> ParseTaskKind(absl::string_view name) {
  for (const TaskKind kind : {TaskKind::kHellaSwag, TaskKind::kPiqa, TaskKind::kWinoGrande,
                              TaskKind::kStoryCloze, TaskKind::kLambada}) {
    if (name == TaskName(kind)) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown task '", name, "': use hellaswag, piqa, winogrande, storycloze or lambada"));
}

absl::string_view TaskName(TaskKind kind) {
  switch (kind) {
    case TaskKind::kHellaSwag:
      return "hellaswag";
    case TaskKind::kPiqa:
      return "piqa";
    case TaskKind::kWinoGrande:
      return "winogrande";
    case TaskKind::kStoryCloze:
      return "storycloze";
    case TaskKind::kLambada:
      return "lambada";
  }
  return "?";
}

absl::StatusOr<TaskExample> ExampleOf(TaskKind kind, const JsonValue& line) {
  if (line.kind != JsonValue::Kind::kObject) {
    return absl::InvalidArgumentError(
        absl::StrCat("a task line must be a JSON object, not ", JsonKindName(line.kind)));
  }
  switch (kind) {
    case TaskKind::kHellaSwag:
      return HellaSwag(line);
    case TaskKind::kPiqa:
      return Piqa(line);
    case TaskKind::kWinoGrande:
      return WinoGrande(line);
    case TaskKind::kStoryCloze:
      return StoryCloze(line);
    case TaskKind::kLambada:
      return Lambada(line);
  }
  return absl::InternalError("unknown task kind");
}

absl::StatusOr<std::vector<TaskExample>> ReadTaskFile(TaskKind kind, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read task file ", path));
  std::vector<TaskExample> examples;
  std::string text;
  for (int number = 1; std::getline(in, text); ++number) {
    if (absl::StripAsciiWhitespace(text).empty()) continue;
    absl::StatusOr<JsonValue> line = ParseJson(text);
    absl::StatusOr<TaskExample> example =
        line.ok() ? ExampleOf(kind, *line) : absl::StatusOr<TaskExample>(line.status());
    if (!example.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number, ": ", TaskName(kind), ": ", example.status().message()));
    }
    examples.push_back(*std::move(example));
  }
  if (in.bad()) return absl::UnavailableError(absl::StrCat("cannot read task file ", path));
  if (examples.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("task file ", path, " holds no examples"));
  }
  return examples;
}

}  // namespace nf::eval
