// eval/report: the JSON's exact text and the table's lines.
#include "eval/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace nf::eval {
namespace {

using ::testing::HasSubstr;

EvalReport Sample() {
  EvalReport r;
  r.checkpoint = "run/checkpoints/iter_0000010";
  r.step = 10;
  r.tensor_parallel = 2;
  r.pipeline_parallel = 1;
  r.data_parallel = 3;
  r.dtype = "f32";
  r.perplexity = PerplexityReport{
      .dataset = "corpus",
      .part = "validation",
      .split = "969,30,1",
      .documents = {.begin = 97, .end = 100},
      .seq_len = 64,
      .result = {
          .windows = 5, .tokens = 300, .loss = 2.5, .ppl = 12.25, .mask_seed = std::nullopt}};
  TaskReport hellaswag;
  hellaswag.kind = TaskKind::kHellaSwag;
  hellaswag.file = "hs.jsonl";
  hellaswag.truncated = 1;
  hellaswag.multiple_choice = {.examples = 4, .acc = 0.5, .acc_norm = 0.75, .acc_token_norm = 0.25};
  TaskReport lambada;
  lambada.kind = TaskKind::kLambada;
  lambada.file = "l.jsonl";
  lambada.last_word = {.examples = 2, .acc = 0.5, .ppl = 40.0};
  r.tasks = {hellaswag, lambada};
  return r;
}

TEST(ReportTest, JsonHasEveryKeyInOrder) {
  EXPECT_EQ(ReportJson(Sample()),
            R"({"checkpoint":"run/checkpoints/iter_0000010","step":10,"tensor_parallel":2,)"
            R"("pipeline_parallel":1,"data_parallel":3,"dtype":"f32","perplexity":{"objective":)"
            R"("causal_lm","dataset":"corpus","part":"validation","split":"969,30,1",)"
            R"("first_document":97,"end_document":100,"seq_len":64,"windows":5,"tokens":300,)"
            R"("loss":2.5,"ppl":12.25},"tasks":{"hellaswag":{"file":"hs.jsonl","examples":4,)"
            R"("truncated":1,"acc":0.5,"acc_norm":0.75,"acc_token_norm":0.25},"lambada":{)"
            R"("file":"l.jsonl","examples":2,"truncated":0,"acc":0.5,"ppl":40}}})"
            "\n");
}

// A masked LM's perplexity says so, and gives the seed that reproduces its masks.
TEST(ReportTest, JsonOfMaskedLmPerplexity) {
  EvalReport r = Sample();
  r.perplexity->result.mask_seed = 7;
  r.tasks.clear();
  EXPECT_EQ(ReportJson(r),
            R"({"checkpoint":"run/checkpoints/iter_0000010","step":10,"tensor_parallel":2,)"
            R"("pipeline_parallel":1,"data_parallel":3,"dtype":"f32","perplexity":{"objective":)"
            R"("masked_lm","dataset":"corpus","part":"validation","split":"969,30,1",)"
            R"("first_document":97,"end_document":100,"seq_len":64,"mask_seed":7,"windows":5,)"
            R"("tokens":300,"loss":2.5,"ppl":12.25}})"
            "\n");
  EXPECT_THAT(ReportTable(r), HasSubstr("300 tokens masked (seed 7) in 5 windows of 64"));
}

TEST(ReportTest, JsonLeavesOutWhatWasNotEvaluated) {
  EvalReport r = Sample();
  r.perplexity.reset();
  r.tasks.clear();
  EXPECT_EQ(ReportJson(r),
            R"({"checkpoint":"run/checkpoints/iter_0000010","step":10,"tensor_parallel":2,)"
            R"("pipeline_parallel":1,"data_parallel":3,"dtype":"f32"})"
            "\n");
}

TEST(ReportTest, TableFitsOneScreen) {
  const std::string table = ReportTable(Sample());
  EXPECT_THAT(table, HasSubstr("tensor 2 x pipeline 1 x data 3, f32"));
  EXPECT_THAT(table, HasSubstr("loss 2.5000, ppl 12.250"));
  EXPECT_THAT(table,
              HasSubstr("hellaswag            4   0.5000    0.7500          0.2500         1"));
  EXPECT_THAT(table, HasSubstr("lambada              2   0.5000"));
  EXPECT_THAT(table, HasSubstr("(ppl 40.000)"));
  size_t lines = 0;
  for (size_t start = 0, end; (end = table.find('\n', start)) != std::string::npos;
       start = end + 1, ++lines) {
    // The first two lines name the checkpoint and the dataset: as long as their paths.
    if (lines >= 2) {
      EXPECT_LE(end - start, 80u) << table.substr(start, end - start);
    }
  }
  EXPECT_EQ(lines, 5u);
}

TEST(ReportTest, ExampleLine) {
  const ScoredExample example = {
      .choices = {{.loglik = -1.5, .tokens = 2, .characters = 4},
                  {.loglik = -0.25, .tokens = 1, .characters = 3, .greedy = true}},
      .label = 1};
  EXPECT_EQ(ExampleLine(TaskKind::kPiqa, 7, example),
            R"({"task":"piqa","index":7,"label":1,"loglik":[-1.5,-0.25],"tokens":[2,1],)"
            R"("characters":[4,3],"greedy":[0,1]})"
            "\n");
}

}  // namespace
}  // namespace nf::eval
