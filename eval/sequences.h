// A request "log P(continuation | context)" as the token sequence the model reads, the way
// lm-evaluation-harness builds it, so that scores compare with its tables:
//   1. whitespace that ends the context moves to the start of the continuation ("a man is " +
//      "sitting" is scored as "a man is" + " sitting": tokenizers attach a space to the word
//      after it);
//   2. the continuation's tokens are those of encode(context + continuation) after the first
//      len(encode(context)) ids, so they are what the whole text tokenizes to, and the context's
//      tokens are encode(context);
//   3. nf-eval puts the end-of-document token first (when the tokenizer has one): the model was
//      trained on documents that follow one, and an empty context still predicts from it;
//   4. a sequence longer than the model's window (seq_len + 1 tokens: seq_len inputs, each
//      predicting the next) loses tokens from its start, the context's oldest, as the harness
//      truncates; a continuation that alone does not fit is refused.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "eval/tasks.h"

namespace nf::eval {

// Step 1: the request with the context's trailing whitespace moved to the continuation.
Request MoveTrailingSpaces(const Request& request);

struct ScoredSequence {
  // [end of document] context continuation, at most seq_len + 1 ids.
  std::vector<int32_t> tokens;
  // tokens[scored_from ..] are the continuation's: each is scored as predicted from the tokens
  // before it (so scored_from >= 1).
  int64_t scored_from = 1;
  bool truncated = false;  // tokens were cut from the start
  int64_t scored_tokens() const { return static_cast<int64_t>(tokens.size()) - scored_from; }
};

// Steps 2 to 4 from the ids of the (moved) context and of context + continuation.
// InvalidArgument when the continuation has no ids of its own, or more than seq_len.
absl::StatusOr<ScoredSequence> SequenceOf(const std::vector<int32_t>& context_ids,
                                          const std::vector<int32_t>& whole_ids,
                                          std::optional<int32_t> end_of_document, int64_t seq_len);

// The characters of a choice, lm-evaluation-harness's acc_norm length: the continuation's
// Unicode code points (UTF-8 lead bytes) without the one space that joins it to the context.
int64_t ChoiceCharacters(const Request& request);

}  // namespace nf::eval
