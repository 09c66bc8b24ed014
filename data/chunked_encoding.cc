#include "data/chunked_encoding.h"

#include <algorithm>
#include <optional>

#include "core/status.h"
#include "data/grapheme_cluster.h"
#include "data/unicode_class.h"

namespace nf::data {
namespace {

// The longest UTF-8 character: the smallest chunk that can always hold one.
constexpr size_t kMinChunkBytes = 4;

// Whether the character that ends just before `end` (> 0) is whitespace.
bool WhitespaceBefore(absl::string_view text, size_t end) {
  return NextUtf8Char(text, PreviousUtf8CharStart(text, end)).klass == CharClass::kSpace;
}

// A chunk text[begin, end) and where the next one starts (end, or end + 1 past a dropped space);
// `inside_word` for an inexact cut between two characters that are not whitespace.
struct Cut {
  size_t end;
  size_t next;
  bool inside_word = false;
};

// Whether an inexact cut at `at` (a character boundary, 0 < at < text.size()) falls inside a
// word: between two characters that are not whitespace.
bool InsideWord(absl::string_view text, size_t at) {
  return !WhitespaceBefore(text, at) && NextUtf8Char(text, at).klass != CharClass::kSpace;
}

// Tokenizer checks an inexact cut may make (each a few encodes of a few characters).
constexpr int kMaxCutChecks = 32;

// Where an inexact cut of the chunk text[begin, ...) goes, at or before `end` (a character
// boundary, begin < end < text.size()), searching the chunk's second half back from `end`: the
// last grapheme cluster boundary inside a word where tokenizer.KeepsTextAcrossCut (of the
// first kMaxCutChecks such boundaries), so that a combining sequence (or a Hangul syllable's
// jamo) is never split and the text is kept; else the first such boundary; else the last
// character boundary inside a word (in a cluster longer than half a chunk); else `end`, inside
// a stretch of whitespace.
size_t InexactCutPosition(const Tokenizer& tokenizer, absl::string_view text, size_t begin,
                          size_t end) {
  const size_t floor = begin + (end - begin) / 2;
  std::optional<size_t> boundary, inside_word;
  int checks = 0;
  for (size_t at = end; at > floor; at = PreviousUtf8CharStart(text, at)) {
    if (!InsideWord(text, at)) continue;
    if (!inside_word) inside_word = at;
    if (!IsGraphemeClusterBoundary(text, at)) continue;
    if (!boundary) boundary = at;
    if (checks++ == kMaxCutChecks) break;
    if (tokenizer.KeepsTextAcrossCut(text, at)) return at;
  }
  return boundary.value_or(inside_word.value_or(end));
}

// `end` moved off any occurrence of `special` (a special token's text) that straddles it: to
// the occurrence's start, or past its end when it starts the chunk at `begin`.
size_t OutsideSpecialToken(absl::string_view text, size_t begin, size_t end,
                           absl::string_view special) {
  if (special.empty() || end >= text.size()) return end;
  const size_t from = end - std::min(end - begin, special.size() - 1);
  const size_t at = text.substr(from, end - from + special.size() - 1).find(special);
  if (at == absl::string_view::npos || from + at == end) return end;
  return from + at > begin ? from + at : from + at + special.size();
}

// The exact cut at `at` (a byte of text, begin < at <= limit < text.size()), if there is one:
// before a single ASCII space between two non-space characters (the space placed as the
// tokenizer says; it must lie before `limit`), or before any whitespace character that follows
// a non-whitespace one, where the tokenizer allows it.
std::optional<Cut> ExactCutAt(const Tokenizer& tokenizer, absl::string_view text, size_t at,
                              size_t limit) {
  if (IsUtf8Continuation(text[at])) return std::nullopt;
  const Utf8Char c = NextUtf8Char(text, at);
  if (c.klass != CharClass::kSpace || WhitespaceBefore(text, at)) return std::nullopt;
  const bool single_space =
      text[at] == ' ' && at < limit && NextUtf8Char(text, at + 1).klass != CharClass::kSpace;
  if (single_space) {
    switch (tokenizer.space_at_cut()) {
      case Tokenizer::SpaceAtCut::kStartsNext:
        return Cut{.end = at, .next = at};
      case Tokenizer::SpaceAtCut::kEndsPrevious:
        return Cut{.end = at + 1, .next = at + 1};
      case Tokenizer::SpaceAtCut::kDropped:
        return Cut{.end = at, .next = at + 1};
    }
  }
  if (tokenizer.CutsBeforeWhitespace(text.substr(at, c.length))) return Cut{.end = at, .next = at};
  return std::nullopt;
}

// The cut of the chunk starting at `begin`, for a text longer than begin + preferred_bytes
// (<= max_bytes), and whether it is exact: the exact cut furthest along that keeps the chunk
// within `preferred_bytes`; else the first one beyond, within `max_bytes`; else, when the rest
// of the text fits in `max_bytes`, none (the chunk is the rest).
Cut NextCut(const Tokenizer& tokenizer, absl::string_view text, size_t begin,
            size_t preferred_bytes, size_t max_bytes, bool& exact) {
  exact = true;
  const size_t preferred_limit = begin + preferred_bytes;
  for (size_t at = preferred_limit; at > begin; --at) {
    if (const std::optional<Cut> cut = ExactCutAt(tokenizer, text, at, preferred_limit)) {
      return *cut;
    }
  }
  // The last byte is never a cut: a cut needs a character after it.
  const size_t limit = std::min(begin + max_bytes, text.size() - 1);
  for (size_t at = preferred_limit + 1; at <= limit; ++at) {
    if (const std::optional<Cut> cut = ExactCutAt(tokenizer, text, at, limit)) return *cut;
  }
  if (text.size() - begin <= max_bytes) return {.end = text.size(), .next = text.size()};
  // No exact cut: the last character boundary that fits. A character is at most 4 bytes, so
  // one starts within 3 bytes before the limit unless the limit is inside a run of invalid
  // bytes, where every byte is a character of its own. A special token's text (which has no
  // spaces) is never cut: it would become text on both sides.
  exact = false;
  size_t end = begin + max_bytes;
  while (end > begin + max_bytes - (kMinChunkBytes - 1) && IsUtf8Continuation(text[end])) --end;
  if (IsUtf8Continuation(text[end])) end = begin + max_bytes;
  if (!IsUtf8Continuation(text[end])) end = InexactCutPosition(tokenizer, text, begin, end);
  end = OutsideSpecialToken(text, begin, end, tokenizer.special_token_text());
  return {.end = end, .next = end, .inside_word = end < text.size() && InsideWord(text, end)};
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> EncodeInChunks(const Tokenizer& tokenizer,
                                                    absl::string_view text, size_t max_chunk_bytes,
                                                    int64_t* inexact_cuts) {
  const size_t max_bytes = std::max(max_chunk_bytes, kMinChunkBytes);
  const size_t preferred_bytes =
      std::clamp(tokenizer.preferred_chunk_bytes(), kMinChunkBytes, max_bytes);
  if (inexact_cuts != nullptr) *inexact_cuts = 0;
  if (text.size() <= preferred_bytes) return tokenizer.Encode(text);
  std::vector<int32_t> ids;
  size_t begin = 0;
  bool starts_inside_word = false;  // the chunk at `begin` continues a word cut before it
  const auto encode = [&](size_t end, bool ends_inside_word) -> absl::Status {
    const absl::string_view chunk = text.substr(begin, end - begin);
    NF_ASSIGN_OR_RETURN(const std::vector<int32_t> chunk_ids,
                        starts_inside_word || ends_inside_word
                            ? tokenizer.EncodeInsideWord(chunk, starts_inside_word,
                                                         ends_inside_word)
                            : tokenizer.Encode(chunk));
    tokenizer.AppendIds(ids, chunk_ids);
    starts_inside_word = ends_inside_word;
    return absl::OkStatus();
  };
  while (text.size() - begin > preferred_bytes) {
    bool exact = true;
    const Cut cut = NextCut(tokenizer, text, begin, preferred_bytes, max_bytes, exact);
    if (!exact && inexact_cuts != nullptr) ++*inexact_cuts;
    NF_RETURN_IF_ERROR(encode(cut.end, cut.inside_word));
    begin = cut.next;
  }
  if (begin < text.size()) NF_RETURN_IF_ERROR(encode(text.size(), false));
  return ids;
}

}  // namespace nf::data
