// eval/tasks: each task's JSON fields become the prompts eval/tasks.h documents.
#include "eval/tasks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/assert_ok.h"

namespace nf::eval {
namespace {

using ::testing::HasSubstr;

TaskExample Example(TaskKind kind, const std::string& line) {
  const auto json = ParseJson(line);
  EXPECT_TRUE(json.ok()) << json.status();
  auto example = ExampleOf(kind, *json);
  EXPECT_TRUE(example.ok()) << example.status();
  return example.ok() ? *example : TaskExample{};
}

TEST(TasksTest, HellaSwagPrefixesTheActivityAndCleansWikiHowMarkup) {
  const TaskExample e =
      Example(TaskKind::kHellaSwag,
              R"({"activity_label": "Roof", "ctx": "A man [header] is on a roof [title] He",)"
              R"( "endings": ["is up.", "[step] falls  down."], "label": "1"})");
  ASSERT_EQ(e.choices.size(), 2u);
  EXPECT_EQ(e.choices[0].context, "Roof: A man is on a roof. He");
  EXPECT_EQ(e.choices[0].continuation, " is up.");
  EXPECT_EQ(e.choices[1].continuation, "  falls down.");
  EXPECT_EQ(e.label, 1);
}

// The harness builds the context from ctx_a and ctx_b capitalized (Python's str.capitalize),
// not from the dataset's "ctx", which keeps ctx_b lower case.
TEST(TasksTest, HellaSwagCapitalizesCtxB) {
  const TaskExample e =
      Example(TaskKind::kHellaSwag,
              R"({"activity_label": "Cooking", "ctx_a": "She smiles.", "ctx_b": "then the Man",)"
              R"( "ctx": "She smiles. then the Man", "endings": ["a.", "b."], "label": 0})");
  EXPECT_EQ(e.choices[0].context, "Cooking: She smiles. Then the man");
  const auto without_b = ParseJson(R"({"ctx_a": "x", "endings": ["a.", "b."], "label": 0})");
  ASSERT_TRUE(without_b.ok());
  EXPECT_THAT(ExampleOf(TaskKind::kHellaSwag, *without_b).status().message(),
              HasSubstr("no \"ctx_b\" field"));
}

TEST(TasksTest, PiqaAsksAQuestion) {
  const TaskExample e =
      Example(TaskKind::kPiqa, R"({"goal": "Open a jar", "sol1": "Twist.", "sol2": "Kick.",)"
                               R"( "label": 1})");
  EXPECT_EQ(e.choices[1].context, "Question: Open a jar\nAnswer:");
  EXPECT_EQ(e.choices[1].continuation, " Kick.");
  EXPECT_EQ(e.label, 1);
}

TEST(TasksTest, WinoGrandeScoresTheSameContinuationAfterEachOption) {
  const TaskExample e = Example(
      TaskKind::kWinoGrande,
      R"({"sentence": "The cup fell off the table because _ was   wobbly. ", "option1": "the cup",)"
      R"( "option2": "the table", "answer": "2"})");
  EXPECT_EQ(e.choices[0].context, "The cup fell off the table because the cup");
  EXPECT_EQ(e.choices[1].context, "The cup fell off the table because the table");
  EXPECT_EQ(e.choices[0].continuation, " was   wobbly.");
  EXPECT_EQ(e.choices[1].continuation, e.choices[0].continuation);
  EXPECT_EQ(e.label, 1);
}

TEST(TasksTest, StoryClozeJoinsTheFourSentences) {
  const TaskExample e =
      Example(TaskKind::kStoryCloze,
              R"({"input_sentence_1": "A.", "input_sentence_2": "B.", "input_sentence_3": "C.",)"
              R"( "input_sentence_4": "D.", "sentence_quiz1": "E.", "sentence_quiz2": "F.",)"
              R"( "answer_right_ending": 1})");
  EXPECT_EQ(e.choices[0].context, "A. B. C. D.");
  EXPECT_EQ(e.choices[1].continuation, " F.");
  EXPECT_EQ(e.label, 0);
}

TEST(TasksTest, LambadaScoresTheLastWord) {
  const TaskExample e = Example(TaskKind::kLambada, R"({"text": "he said hello to  Mary"})");
  ASSERT_EQ(e.choices.size(), 1u);
  EXPECT_EQ(e.choices[0].context, "he said hello to ");
  EXPECT_EQ(e.choices[0].continuation, " Mary");
}

TEST(TasksTest, RefusesMissingWrongAndOutOfRangeFields) {
  const std::tuple<TaskKind, const char*, const char*> cases[] = {
      {TaskKind::kHellaSwag, R"({"endings": ["a", "b"], "label": 0})", "no \"ctx\" field"},
      {TaskKind::kHellaSwag, R"({"ctx": "x", "endings": ["a"], "label": 0})", "at least two"},
      {TaskKind::kHellaSwag, R"({"ctx": "x", "endings": ["a", 2], "label": 0})", "strings only"},
      {TaskKind::kHellaSwag, R"({"ctx": "x", "endings": ["a", "b"], "label": 2})",
       "\"label\" must be an integer from 0 to 1"},
      {TaskKind::kPiqa, R"({"goal": 1, "sol1": "a", "sol2": "b", "label": 0})",
       "\"goal\" is a number, not a string"},
      {TaskKind::kPiqa, R"({"goal": "g", "sol1": "a", "sol2": "b", "label": "x"})",
       "must be an integer"},
      {TaskKind::kWinoGrande,
       R"({"sentence": "no blank", "option1": "a", "option2": "b",)"
       R"( "answer": "1"})",
       "exactly one '_'"},
      {TaskKind::kWinoGrande,
       R"({"sentence": "_ x", "option1": "a", "option2": "b",)"
       R"( "answer": "0"})",
       "from 1 to 2"},
      {TaskKind::kLambada, R"({"text": "oneword"})", "the last one the target"},
      {TaskKind::kLambada, R"(["text"])", "must be a JSON object, not an array"},
  };
  for (const auto& [kind, line, message] : cases) {
    const auto json = ParseJson(line);
    NF_ASSERT_OK(json) << line;
    const auto example = ExampleOf(kind, *json);
    ASSERT_FALSE(example.ok()) << line;
    EXPECT_THAT(example.status().message(), HasSubstr(message)) << line;
  }
}

TEST(TasksTest, ReadTaskFileNamesTheFileAndLine) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "nf_eval_tasks_test.jsonl").string();
  std::ofstream(path) << R"({"text": "a b"})"
                      << "\n\n"
                      << R"({"text": "a b")"
                      << "\n";
  const auto examples = ReadTaskFile(TaskKind::kLambada, path);
  ASSERT_FALSE(examples.ok());
  EXPECT_THAT(examples.status().message(),
              HasSubstr(path + ":3: lambada: column 15: expected ',' or '}'"));
  std::ofstream(path) << R"({"text": "a b"})"
                      << "\n\n"
                      << R"({"text": "c d e"})"
                      << "\n";
  const auto read = ReadTaskFile(TaskKind::kLambada, path);
  NF_ASSERT_OK(read);
  EXPECT_EQ(read->size(), 2u);
  std::ofstream(path) << "\n";
  EXPECT_THAT(ReadTaskFile(TaskKind::kLambada, path).status().message(),
              HasSubstr("holds no examples"));
  std::filesystem::remove(path);
  EXPECT_EQ(ReadTaskFile(TaskKind::kLambada, path).status().code(), absl::StatusCode::kNotFound);
}

TEST(TasksTest, TaskNamesRoundTrip) {
  for (const char* name : {"hellaswag", "piqa", "winogrande", "storycloze", "lambada"}) {
    const auto kind = ParseTaskKind(name);
    NF_ASSERT_OK(kind);
    EXPECT_EQ(TaskName(*kind), name);
  }
  EXPECT_THAT(ParseTaskKind("arc").status().message(), HasSubstr("unknown task 'arc'"));
}

}  // namespace
}  // namespace nf::eval
