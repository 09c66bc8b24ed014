#include "data/chunked_encoding.h"

#include <algorithm>

#include "core/status.h"
#include "data/unicode_class.h"

namespace nf::data {
namespace {

// The longest UTF-8 character: the smallest chunk that can always hold one.
constexpr size_t kMinChunkBytes = 4;

bool IsContinuation(char byte) { return (static_cast<unsigned char>(byte) & 0xC0) == 0x80; }

// Whether the character that ends just before `end` (> 0) is whitespace. Its start is at most 3
// bytes back; when no well-formed character ends exactly there, the byte before `end` is an
// invalid byte, a character of its own that is not whitespace (as NextUtf8Char reads it).
bool WhitespaceBefore(absl::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && end - start < kMinChunkBytes && IsContinuation(text[start])) --start;
  const Utf8Char c = NextUtf8Char(text, start);
  return start + c.length == end && c.klass == CharClass::kSpace;
}

// A chunk text[begin, end) and where the next one starts (end, or end + 1 past a dropped space).
struct Cut {
  size_t end;
  size_t next;
};

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

// The cut of the chunk starting at `begin`, for a text longer than begin + max_bytes, and
// whether it is exact. The exact cut furthest along that fits: at a single ASCII space between
// two non-space characters (the space placed as the tokenizer says), or before any whitespace
// character that follows a non-whitespace one, where the tokenizer allows it.
Cut NextCut(const Tokenizer& tokenizer, absl::string_view text, size_t begin, size_t max_bytes,
            bool& exact) {
  exact = true;
  const size_t limit = begin + max_bytes;
  for (size_t at = limit; at > begin; --at) {
    if (IsContinuation(text[at])) continue;
    const Utf8Char c = NextUtf8Char(text, at);
    if (c.klass != CharClass::kSpace || WhitespaceBefore(text, at)) continue;
    const bool single_space =
        text[at] == ' ' && at < limit && NextUtf8Char(text, at + 1).klass != CharClass::kSpace;
    if (single_space) {
      switch (tokenizer.space_at_cut()) {
        case Tokenizer::SpaceAtCut::kStartsNext:
          return {.end = at, .next = at};
        case Tokenizer::SpaceAtCut::kEndsPrevious:
          return {.end = at + 1, .next = at + 1};
        case Tokenizer::SpaceAtCut::kDropped:
          return {.end = at, .next = at + 1};
      }
    }
    if (tokenizer.CutsBeforeWhitespace(text.substr(at, c.length))) return {.end = at, .next = at};
  }
  // No exact cut: the last character boundary that fits. A character is at most 4 bytes, so
  // one starts within 3 bytes before the limit unless the limit is inside a run of invalid
  // bytes, where every byte is a character of its own. A special token's text (which has no
  // spaces) is never cut: it would become text on both sides.
  exact = false;
  size_t end = limit;
  while (end > limit - (kMinChunkBytes - 1) && IsContinuation(text[end])) --end;
  if (IsContinuation(text[end])) end = limit;
  end = OutsideSpecialToken(text, begin, end, tokenizer.special_token_text());
  return {.end = end, .next = end};
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> EncodeInChunks(const Tokenizer& tokenizer,
                                                    absl::string_view text, size_t max_chunk_bytes,
                                                    int64_t* inexact_cuts) {
  const size_t max_bytes = std::max(max_chunk_bytes, kMinChunkBytes);
  if (inexact_cuts != nullptr) *inexact_cuts = 0;
  if (text.size() <= max_bytes) return tokenizer.Encode(text);
  std::vector<int32_t> ids;
  size_t begin = 0;
  while (text.size() - begin > max_bytes) {
    bool exact = true;
    const Cut cut = NextCut(tokenizer, text, begin, max_bytes, exact);
    if (!exact && inexact_cuts != nullptr) ++*inexact_cuts;
    NF_ASSIGN_OR_RETURN(const std::vector<int32_t> chunk_ids,
                        tokenizer.Encode(text.substr(begin, cut.end - begin)));
    ids.insert(ids.end(), chunk_ids.begin(), chunk_ids.end());
    begin = cut.next;
  }
  NF_ASSIGN_OR_RETURN(const std::vector<int32_t> last_ids, tokenizer.Encode(text.substr(begin)));
  ids.insert(ids.end(), last_ids.begin(), last_ids.end());
  return ids;
}

}  // namespace nf::data
