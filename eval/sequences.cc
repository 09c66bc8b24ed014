#include "eval/sequences.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace nf::eval {

Request MoveTrailingSpaces(const Request& request) {
  // npos + 1 == 0: a context of whitespace only moves whole.
  const size_t kept = request.context.find_last_not_of(" \t\n\v\f\r") + 1;
  return {.context = request.context.substr(0, kept),
          .continuation = request.context.substr(kept) + request.continuation};
}

absl::StatusOr<ScoredSequence> SequenceOf(const std::vector<int32_t>& context_ids,
                                          const std::vector<int32_t>& whole_ids,
                                          std::optional<int32_t> end_of_document, int64_t seq_len) {
  const int64_t context = static_cast<int64_t>(context_ids.size());
  const int64_t continuation = static_cast<int64_t>(whole_ids.size()) - context;
  if (continuation <= 0) {
    return absl::InvalidArgumentError(
        "the continuation has no tokens of its own (the context's tokens cover the whole text)");
  }
  if (continuation > seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("the continuation's ", continuation,
                                                   " tokens exceed the window of ", seq_len));
  }
  ScoredSequence sequence;
  if (end_of_document) sequence.tokens.push_back(*end_of_document);
  sequence.tokens.insert(sequence.tokens.end(), context_ids.begin(), context_ids.end());
  sequence.tokens.insert(sequence.tokens.end(), whole_ids.begin() + context, whole_ids.end());
  sequence.scored_from = static_cast<int64_t>(sequence.tokens.size()) - continuation;
  if (sequence.scored_from == 0) {
    return absl::InvalidArgumentError(
        "nothing precedes the continuation: give a context, or a tokenizer with an "
        "end-of-document token");
  }
  const int64_t excess = static_cast<int64_t>(sequence.tokens.size()) - (seq_len + 1);
  if (excess > 0) {
    sequence.tokens.erase(sequence.tokens.begin(), sequence.tokens.begin() + excess);
    sequence.scored_from -= excess;
    sequence.truncated = true;
  }
  return sequence;
}

int64_t ChoiceCharacters(const Request& request) {
  // The choice is the continuation without its one delimiting space (lm-evaluation-harness's
  // len(choice)); a space the choice itself begins with counts.
  const size_t first = absl::StartsWith(request.continuation, " ") ? 1 : 0;
  int64_t characters = 0;
  for (size_t i = first; i < request.continuation.size(); ++i) {
    // Every byte but UTF-8 continuation bytes (10xxxxxx) starts a code point.
    if ((static_cast<unsigned char>(request.continuation[i]) & 0xC0) != 0x80) ++characters;
  }
  return characters;
}

}  // namespace nf::eval
