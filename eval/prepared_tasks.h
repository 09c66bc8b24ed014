// Task files made ready to score before any model exists: read, every text tokenized in one
// nf-tokenize run (eval/tokenizer_client.h, before MPI starts), and each choice of each example
// built into its token sequence (eval/sequences.h); then, once scored, turned back into examples
// with per-choice scores.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "eval/metrics.h"
#include "eval/sequences.h"
#include "eval/tasks.h"
#include "eval/tokenizer_protocol.h"
#include "eval/zero_shot.h"

namespace nf::eval {

struct TaskFile {
  TaskKind kind = TaskKind::kHellaSwag;
  std::string path;
};

struct PreparedTask {
  TaskKind kind = TaskKind::kHellaSwag;
  std::string file;
  std::vector<TaskExample> examples;
  // Every choice of every example, in order, and each one's characters (ChoiceCharacters).
  std::vector<ScoredSequence> sequences;
  std::vector<int64_t> characters;
  int64_t truncated() const;
};

struct TaskPreparation {
  int64_t max_examples = 0;       // the first this many examples of each file (0: all)
  std::string tokenizer_program;  // nf-tokenize
  TokenizerFlags tokenizer;
  int64_t window = 0;       // the most predictions a sequence may have (its inputs)
  int64_t model_vocab = 0;  // model.vocab_size: every id must be below it
};

// FailedPrecondition when the tokenizer's vocabulary exceeds the model's; errors of a task file
// or an example name the file and the example.
absl::StatusOr<std::vector<PreparedTask>> PrepareTasks(const std::vector<TaskFile>& files,
                                                       const TaskPreparation& preparation);

// The longest sequence of any task, in model inputs (tokens - 1).
int64_t LongestInput(const std::vector<PreparedTask>& tasks);

// The task's examples with the scores of its sequences (scores[i] for sequences[i]).
std::vector<ScoredExample> ScoredExamples(const PreparedTask& task,
                                          const std::vector<SequenceScore>& scores);

}  // namespace nf::eval
