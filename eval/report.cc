#include "eval/report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "launcher/jsonl_log.h"

namespace nf::eval {

using launcher::JsonObject;

std::string ReportJson(const EvalReport& report) {
  JsonObject json;
  json.AddString("checkpoint", report.checkpoint)
      .AddInt("step", report.step)
      .AddInt("tensor_parallel", report.tensor_parallel)
      .AddInt("pipeline_parallel", report.pipeline_parallel)
      .AddInt("data_parallel", report.data_parallel)
      .AddString("dtype", report.dtype);
  if (report.perplexity) {
    const PerplexityReport& p = *report.perplexity;
    const std::optional<uint32_t>& mask_seed = p.result.mask_seed;
    JsonObject perplexity;
    perplexity.AddString("objective", mask_seed ? "masked_lm" : "causal_lm")
        .AddString("dataset", p.dataset)
        .AddString("part", p.part)
        .AddString("split", p.split)
        .AddInt("first_document", p.documents.begin)
        .AddInt("end_document", p.documents.end)
        .AddInt("seq_len", p.seq_len);
    if (mask_seed) perplexity.AddInt("mask_seed", *mask_seed);
    perplexity.AddInt("windows", p.result.windows)
        .AddInt("tokens", p.result.tokens)
        .AddDouble("loss", p.result.loss)
        .AddDouble("ppl", p.result.ppl);
    json.AddObject("perplexity", perplexity);
  }
  if (!report.tasks.empty()) {
    JsonObject tasks;
    for (const TaskReport& task : report.tasks) {
      JsonObject t;
      t.AddString("file", task.file);
      if (IsMultipleChoice(task.kind)) {
        t.AddInt("examples", task.multiple_choice.examples)
            .AddInt("truncated", task.truncated)
            .AddDouble("acc", task.multiple_choice.acc)
            .AddDouble("acc_norm", task.multiple_choice.acc_norm)
            .AddDouble("acc_token_norm", task.multiple_choice.acc_token_norm);
      } else {
        t.AddInt("examples", task.last_word.examples)
            .AddInt("truncated", task.truncated)
            .AddDouble("acc", task.last_word.acc)
            .AddDouble("ppl", task.last_word.ppl);
      }
      tasks.AddObject(TaskName(task.kind), t);
    }
    json.AddObject("tasks", tasks);
  }
  return json.ToString() + "\n";
}

std::string ReportTable(const EvalReport& report) {
  std::string out =
      absl::StrFormat("nf-eval: %s (step %d), tensor %d x pipeline %d x data %d, %s\n",
                      report.checkpoint, report.step, report.tensor_parallel,
                      report.pipeline_parallel, report.data_parallel, report.dtype);
  if (report.perplexity) {
    const PerplexityReport& p = *report.perplexity;
    const std::string masked =
        p.result.mask_seed ? absl::StrFormat(" masked (seed %d)", *p.result.mask_seed) : "";
    absl::StrAppendFormat(&out,
                          "perplexity  %s part of %s (documents %d-%d): %d tokens%s in %d windows "
                          "of %d, loss %.4f, ppl %.3f\n",
                          p.part, p.dataset, p.documents.begin, p.documents.end, p.result.tokens,
                          masked, p.result.windows, p.seq_len, p.result.loss, p.result.ppl);
  }
  if (report.tasks.empty()) return out;
  absl::StrAppendFormat(&out, "%-12s %9s %8s %9s %15s %9s\n", "task", "examples", "acc", "acc_norm",
                        "acc_token_norm", "truncated");
  for (const TaskReport& task : report.tasks) {
    if (IsMultipleChoice(task.kind)) {
      const MultipleChoiceAccuracy& a = task.multiple_choice;
      absl::StrAppendFormat(&out, "%-12s %9d %8.4f %9.4f %15.4f %9d\n", TaskName(task.kind),
                            a.examples, a.acc, a.acc_norm, a.acc_token_norm, task.truncated);
    } else {
      const LastWordAccuracy& a = task.last_word;
      absl::StrAppendFormat(&out, "%-12s %9d %8.4f %25s %9d\n", TaskName(task.kind), a.examples,
                            a.acc, absl::StrFormat("(ppl %.3f)", a.ppl), task.truncated);
    }
  }
  return out;
}

std::string ExampleLine(TaskKind kind, int64_t index, const ScoredExample& example) {
  std::vector<double> loglik, tokens, characters, greedy;
  for (const ChoiceScore& c : example.choices) {
    loglik.push_back(c.loglik);
    tokens.push_back(static_cast<double>(c.tokens));
    characters.push_back(static_cast<double>(c.characters));
    greedy.push_back(c.greedy ? 1.0 : 0.0);
  }
  return JsonObject()
             .AddString("task", TaskName(kind))
             .AddInt("index", index)
             .AddInt("label", example.label)
             .AddDoubleArray("loglik", loglik)
             .AddDoubleArray("tokens", tokens)
             .AddDoubleArray("characters", characters)
             .AddDoubleArray("greedy", greedy)
             .ToString() +
         "\n";
}

}  // namespace nf::eval
