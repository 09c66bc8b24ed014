#include "eval/prepared_tasks.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "eval/tokenizer_client.h"

namespace nf::eval {

int64_t PreparedTask::truncated() const {
  return std::count_if(sequences.begin(), sequences.end(),
                       [](const ScoredSequence& s) { return s.truncated; });
}

absl::StatusOr<std::vector<PreparedTask>> PrepareTasks(const std::vector<TaskFile>& files,
                                                       const TaskPreparation& preparation) {
  std::vector<PreparedTask> tasks;
  // Each distinct text once: the choices of an example share their context.
  std::map<std::string, size_t> text_index;
  std::vector<std::string> texts;
  const auto add_text = [&](const std::string& text) {
    if (text_index.emplace(text, texts.size()).second) texts.push_back(text);
  };
  for (const TaskFile& file : files) {
    PreparedTask& task = tasks.emplace_back();
    task.kind = file.kind;
    task.file = file.path;
    NF_ASSIGN_OR_RETURN(task.examples, ReadTaskFile(file.kind, file.path));
    if (preparation.max_examples > 0 &&
        static_cast<int64_t>(task.examples.size()) > preparation.max_examples) {
      task.examples.resize(preparation.max_examples);
    }
    for (const TaskExample& example : task.examples) {
      for (const Request& choice : example.choices) {
        const Request moved = MoveTrailingSpaces(choice);
        add_text(moved.context);
        add_text(moved.context + moved.continuation);
      }
    }
  }
  NF_ASSIGN_OR_RETURN(const TokenizedTexts tokenized,
                      TokenizeTexts(preparation.tokenizer_program, preparation.tokenizer, texts));
  if (tokenized.vocab_size > preparation.model_vocab) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the tokenizer's vocabulary has ", tokenized.vocab_size, " entries, the model's ",
        preparation.model_vocab, ": it is not the tokenizer the model was trained with"));
  }
  for (PreparedTask& task : tasks) {
    for (size_t e = 0; e < task.examples.size(); ++e) {
      for (const Request& choice : task.examples[e].choices) {
        const Request moved = MoveTrailingSpaces(choice);
        auto sequence = SequenceOf(tokenized.ids[text_index.at(moved.context)],
                                   tokenized.ids[text_index.at(moved.context + moved.continuation)],
                                   tokenized.end_of_document, preparation.window);
        if (!sequence.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(task.file, ": ", TaskName(task.kind),
                                                         " example ", e + 1, ": ",
                                                         sequence.status().message()));
        }
        task.sequences.push_back(*std::move(sequence));
        task.characters.push_back(ChoiceCharacters(choice));
      }
    }
  }
  return tasks;
}

int64_t LongestInput(const std::vector<PreparedTask>& tasks) {
  int64_t longest = 0;
  for (const PreparedTask& task : tasks) {
    for (const ScoredSequence& s : task.sequences) {
      longest = std::max(longest, static_cast<int64_t>(s.tokens.size()) - 1);
    }
  }
  return longest;
}

std::vector<ScoredExample> ScoredExamples(const PreparedTask& task,
                                          const std::vector<SequenceScore>& scores) {
  std::vector<ScoredExample> examples;
  size_t next = 0;
  for (const TaskExample& example : task.examples) {
    ScoredExample& scored = examples.emplace_back();
    scored.label = example.label;
    for (size_t c = 0; c < example.choices.size(); ++c, ++next) {
      scored.choices.push_back({.loglik = scores[next].loglik,
                                .tokens = task.sequences[next].scored_tokens(),
                                .characters = task.characters[next],
                                .greedy = scores[next].greedy});
    }
  }
  return examples;
}

}  // namespace nf::eval
