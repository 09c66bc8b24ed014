// nf-eval's results: a JSON object (--out) and a table for the terminal, both from one
// EvalReport. The JSON, every key always present for what was evaluated:
//   {"checkpoint": DIR, "step": N, "tensor_parallel": T, "pipeline_parallel": P,
//    "data_parallel": D, "dtype": "f32",
//    "perplexity": {"objective": "causal_lm", "dataset": PREFIX, "part": "validation",
//                   "split": "969,30,1", "first_document": A, "end_document": B, "seq_len": S,
//                   "windows": W, "tokens": N, "loss": L, "ppl": exp(L)},    (with --dataset)
//    "tasks": {"hellaswag": {"file": F, "examples": N, "truncated": K, "acc": a,
//                            "acc_norm": b, "acc_token_norm": c},
//              "lambada": {"file": F, "examples": N, "truncated": K, "acc": a, "ppl": p}}}
// A masked LM's perplexity has "objective": "masked_lm", "tokens" its masked tokens, and
// "mask_seed": M after "seq_len" (eval/perplexity.h).
// "truncated" counts the requests whose context lost tokens to the window (eval/sequences.h).
// Per-example scores go to a JSON Lines file of their own (ExampleLine).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/document_source.h"
#include "eval/metrics.h"
#include "eval/perplexity.h"
#include "eval/tasks.h"

namespace nf::eval {

struct PerplexityReport {
  std::string dataset, part, split;
  data::DocumentRange documents;
  int64_t seq_len = 0;
  PerplexityResult result;
};

struct TaskReport {
  TaskKind kind = TaskKind::kHellaSwag;
  std::string file;
  int64_t truncated = 0;
  MultipleChoiceAccuracy multiple_choice;  // multiple-choice tasks
  LastWordAccuracy last_word;              // LAMBADA
};

struct EvalReport {
  std::string checkpoint;
  int64_t step = 0;
  int tensor_parallel = 1, pipeline_parallel = 1, data_parallel = 1;
  std::string dtype;
  std::optional<PerplexityReport> perplexity;
  std::vector<TaskReport> tasks;
};

std::string ReportJson(const EvalReport& report);
// A few lines, at most 80 columns for up to a dozen tasks.
std::string ReportTable(const EvalReport& report);

// One example's scores as a JSON line: {"task", "index", "label", "loglik": [per choice],
// "tokens": [..], "characters": [..], "greedy": [0 or 1 ..]}.
std::string ExampleLine(TaskKind kind, int64_t index, const ScoredExample& example);

}  // namespace nf::eval
