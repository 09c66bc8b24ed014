// eval/sequences: requests as token sequences, lm-evaluation-harness's way.
#include "eval/sequences.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/assert_ok.h"

namespace nf::eval {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SequencesTest, TrailingWhitespaceMovesToTheContinuation) {
  const Request moved = MoveTrailingSpaces({.context = "a man is \t ", .continuation = "sitting"});
  EXPECT_EQ(moved.context, "a man is");
  EXPECT_EQ(moved.continuation, " \t sitting");
  const Request all = MoveTrailingSpaces({.context = "  ", .continuation = "x"});
  EXPECT_EQ(all.context, "");
  EXPECT_EQ(all.continuation, "  x");
  const Request none = MoveTrailingSpaces({.context = "a", .continuation = " b"});
  EXPECT_EQ(none.context, "a");
  EXPECT_EQ(none.continuation, " b");
}

TEST(SequencesTest, TheContinuationIsTheWholeTextsIdsAfterTheContexts) {
  // The context encodes to [5, 6]; the whole text merges differently at the seam ([5, 7, 8]):
  // the continuation is [8], after as many ids as the context has, and the context's own ids
  // come first, as the harness feeds them.
  const auto s = SequenceOf({5, 6}, {5, 7, 8}, /*end_of_document=*/99, /*seq_len=*/16);
  NF_ASSERT_OK(s);
  EXPECT_THAT(s->tokens, ElementsAre(99, 5, 6, 8));
  EXPECT_EQ(s->scored_from, 3);
  EXPECT_EQ(s->scored_tokens(), 1);
  EXPECT_FALSE(s->truncated);
}

TEST(SequencesTest, WithoutAnEndOfDocumentTokenTheContextComesFirst) {
  const auto s = SequenceOf({1, 2}, {1, 2, 3, 4}, std::nullopt, 16);
  NF_ASSERT_OK(s);
  EXPECT_THAT(s->tokens, ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(s->scored_from, 2);
  // Nothing to predict the first token from.
  EXPECT_THAT(SequenceOf({}, {1, 2}, std::nullopt, 16).status().message(),
              HasSubstr("nothing precedes the continuation"));
  const auto empty_context = SequenceOf({}, {1, 2}, 0, 16);
  NF_ASSERT_OK(empty_context);
  EXPECT_THAT(empty_context->tokens, ElementsAre(0, 1, 2));
}

TEST(SequencesTest, TooLongSequencesLoseTheirOldestTokens) {
  // 1 + 6 + 3 = 10 tokens into a window of seq_len 5 (6 tokens): the first 4 go.
  const auto s = SequenceOf({1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, 0, 5);
  NF_ASSERT_OK(s);
  EXPECT_THAT(s->tokens, ElementsAre(4, 5, 6, 7, 8, 9));
  EXPECT_EQ(s->scored_from, 3);
  EXPECT_EQ(s->scored_tokens(), 3);
  EXPECT_TRUE(s->truncated);
  // A continuation of exactly seq_len tokens keeps one token before it.
  const auto fits = SequenceOf({1}, {1, 2, 3, 4, 5, 6}, 0, 5);
  NF_ASSERT_OK(fits);
  EXPECT_THAT(fits->tokens, ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_EQ(fits->scored_from, 1);
  EXPECT_THAT(SequenceOf({1}, {1, 2, 3, 4, 5, 6, 7}, 0, 5).status().message(),
              HasSubstr("the continuation's 6 tokens exceed the window of 5"));
}

TEST(SequencesTest, AContinuationNeedsIdsOfItsOwn) {
  EXPECT_THAT(SequenceOf({1, 2}, {1, 2}, 0, 16).status().message(),
              HasSubstr("no tokens of its own"));
}

TEST(SequencesTest, ChoiceCharactersCountCodePointsWithoutTheJoiningSpace) {
  EXPECT_EQ(ChoiceCharacters({.context = "x", .continuation = " mat."}), 4);
  // The harness's len(choice): a space the choice itself begins with counts.
  EXPECT_EQ(ChoiceCharacters({.context = "x", .continuation = "  caf\xC3\xA9!"}), 6);
  EXPECT_EQ(ChoiceCharacters({.context = "x", .continuation = " "}), 0);
}

}  // namespace
}  // namespace nf::eval
