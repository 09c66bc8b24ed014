// The generation loop on fixed logits: what it feeds, where it stops, and prompt files.
#include "generate/generation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "generate/prompts.h"
#include "generate/text_decoder.h"

namespace nf::generate {
namespace {

GenerationOptions Greedy(int64_t max_new_tokens, std::optional<int32_t> end_of_document = {}) {
  GenerationOptions options;
  options.max_new_tokens = max_new_tokens;
  options.end_of_document = end_of_document;
  options.sampling.temperature = 0.0;
  return options;
}

// A model over 4 ids that always predicts (last token + 1) % 4.
struct Counting {
  std::vector<int32_t> fed;
  absl::StatusOr<std::vector<float>> operator()(int32_t token) {
    fed.push_back(token);
    std::vector<float> logits(4, 0.0f);
    logits[(token + 1) % 4] = 10.0f;
    return logits;
  }
};

TEST(GenerationTest, FeedsThePromptThenEachNewTokenAndStopsAtTheLength) {
  Counting model;
  const std::vector<int32_t> prompt = {3, 0};
  const auto generated = GenerateTokens(prompt, Greedy(2), 0, std::ref(model));
  ASSERT_TRUE(generated.ok());
  EXPECT_EQ(generated->ids, (std::vector<int32_t>{1, 2}));
  EXPECT_FALSE(generated->ended_document);
  // The last new token is not fed: nothing reads its logits.
  EXPECT_EQ(model.fed, (std::vector<int32_t>{3, 0, 1}));
}

TEST(GenerationTest, StopsAtTheEndOfDocumentTokenWithoutKeepingIt) {
  Counting model;
  const std::vector<int32_t> prompt = {0};
  const auto generated = GenerateTokens(prompt, Greedy(10, 3), 0, std::ref(model));
  ASSERT_TRUE(generated.ok());
  EXPECT_EQ(generated->ids, (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(generated->ended_document);
}

TEST(GenerationTest, ZeroNewTokensAndEmptyPrompts) {
  Counting model;
  const std::vector<int32_t> prompt = {0};
  EXPECT_TRUE(GenerateTokens(prompt, Greedy(0), 0, std::ref(model))->ids.empty());
  EXPECT_FALSE(GenerateTokens({}, Greedy(1), 0, std::ref(model)).ok());
}

TEST(PromptFileTest, ReadsLinesOrJsonLines) {
  const std::string path = ::testing::TempDir() + "/prompts.txt";
  std::ofstream(path) << "The cat\n\nA dog \r\n";
  EXPECT_EQ(*ReadPromptFile(path), (std::vector<std::string>{"The cat", "A dog "}));
  std::ofstream(path) << "{\"prompt\": \"x\\ny\"}\n{\"text\": \"z\", \"other\": 1}\n";
  EXPECT_EQ(*ReadPromptFile(path), (std::vector<std::string>{"x\ny", "z"}));
  std::ofstream(path) << "{\"prompt\": 3}\n";
  EXPECT_FALSE(ReadPromptFile(path).ok());
  EXPECT_EQ(ReadPromptFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

// A directory, or a file with no prompt in it, is refused: it used to generate from one empty
// prompt as if the user had asked for that.
TEST(PromptFileTest, ADirectoryOrAFileWithoutPromptsIsRefused) {
  const std::string dir = ::testing::TempDir() + "/prompt_dir";
  std::filesystem::create_directories(dir);
  const absl::Status directory = ReadPromptFile(dir).status();
  EXPECT_EQ(directory.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(directory.message()), ::testing::HasSubstr("is a directory"));
  const std::string empty = ::testing::TempDir() + "/no_prompts.txt";
  std::ofstream(empty) << "\n\r\n\n";
  const absl::Status nothing = ReadPromptFile(empty).status();
  EXPECT_EQ(nothing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(nothing.message()), ::testing::HasSubstr("holds no prompt"));
}

// A SentencePiece-like decoder: id 0 "▁The", 1 "▁secret", 2 "▁of", 3 "s"; the text's first space
// (its dummy prefix) dropped.
absl::StatusOr<std::string> PieceDecode(std::span<const int32_t> ids) {
  const char* pieces[] = {" The", " secret", " of", "s"};
  std::string text;
  for (const int32_t id : ids) text += pieces[id];
  if (!text.empty() && text[0] == ' ') text.erase(0, 1);
  return text;
}

TEST(ContinuationTextTest, KeepsTheSpaceThatDecodingTheNewIdsAloneDrops) {
  const std::vector<int32_t> prompt = {0, 1}, fresh = {2, 3};
  EXPECT_EQ(*PieceDecode(fresh), "ofs");
  EXPECT_EQ(*ContinuationText(prompt, fresh, PieceDecode), " ofs");
  // Without a prompt the continuation starts a text: no space.
  EXPECT_EQ(*ContinuationText({}, fresh, PieceDecode), "ofs");
  EXPECT_EQ(*ContinuationText(prompt, {}, PieceDecode), "");
}

TEST(ValidUtf8Test, ReplacesEachInvalidSequenceOnce) {
  EXPECT_EQ(ValidUtf8("caf\xC3\xA9 \xE2\x82\xAC"), "caf\xC3\xA9 \xE2\x82\xAC");
  // A cut three-byte sequence at the end (a token ending inside a character).
  EXPECT_EQ(ValidUtf8("a\xE2\x82"), "a\xEF\xBF\xBD");
  // A lone continuation byte, an overlong form, a surrogate.
  EXPECT_EQ(ValidUtf8("\x80x"), "\xEF\xBF\xBDx");
  EXPECT_EQ(ValidUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(ValidUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

}  // namespace
}  // namespace nf::generate
