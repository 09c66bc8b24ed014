// The zero-shot tasks nf-eval scores, read from JSON Lines files with the fields of the public
// datasets, and the prompt each example becomes: a list of requests "log P(continuation |
// context)", one per choice, and the index of the right choice. The prompts are those of
// lm-evaluation-harness (EleutherAI), so that accuracies compare with its published tables:
//
//   hellaswag   {"ctx", "endings": [..], "label", optional "activity_label"}
//               context "<activity_label>: <ctx>", choice i " <endings[i]>"; both cleaned of
//               WikiHow markup: " [title]" -> ". ", other "[...]" removed, double spaces single
//   piqa        {"goal", "sol1", "sol2", "label"}: context "Question: <goal>\nAnswer:", choice
//               " <sol1>" or " <sol2>"
//   winogrande  {"sentence" (one "_"), "option1", "option2", "answer": "1" or "2"}: partial
//               scoring (Trinh & Le 2018, as GPT-3): context "<sentence before _><option i>",
//               the same continuation " <sentence after _, trimmed>" for both
//   storycloze  {"input_sentence_1".."input_sentence_4", "sentence_quiz1", "sentence_quiz2",
//               "answer_right_ending": 1 or 2}: context the four sentences joined by spaces,
//               choice " <sentence_quiz i>"
//   lambada     {"text"}: context the text before its last space, the one continuation
//               " <last word>"
//
// Labels may be JSON integers or strings of digits (Hugging Face's datasets write both);
// hellaswag's and piqa's count from 0, winogrande's and storycloze's from 1.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/json_value.h"

namespace nf::eval {

enum class TaskKind { kHellaSwag, kPiqa, kWinoGrande, kStoryCloze, kLambada };

// "hellaswag", "piqa", "winogrande", "storycloze", "lambada"; InvalidArgument listing them.
absl::StatusOr<TaskKind> ParseTaskKind(absl::string_view name);
absl::string_view TaskName(TaskKind kind);
// Multiple choice (accuracy over choices) rather than LAMBADA's greedy last word.
inline bool IsMultipleChoice(TaskKind kind) { return kind != TaskKind::kLambada; }

// log P(continuation | context): the continuation's tokens are scored, the context's are not.
struct Request {
  std::string context;
  std::string continuation;
};

struct TaskExample {
  std::vector<Request> choices;  // LAMBADA: one
  int label = 0;                 // index into choices of the right one (LAMBADA: 0)
};

// The example one JSON line of `kind` describes. InvalidArgument naming the field that is
// missing, of the wrong kind, or out of range.
absl::StatusOr<TaskExample> ExampleOf(TaskKind kind, const JsonValue& line);

// Every example of a task file (blank lines skipped). Errors name "path:line".
absl::StatusOr<std::vector<TaskExample>> ReadTaskFile(TaskKind kind, const std::string& path);

}  // namespace nf::eval
