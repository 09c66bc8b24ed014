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

// The cut of the chunk starting at `begin`, for a text longer than begin + max_bytes.
Cut NextCut(absl::string_view text, size_t begin, size_t max_bytes,
            Tokenizer::SpaceAtCut space_at_cut, absl::string_view special) {
  // A space at `space` ends up in this chunk for kEndsPrevious, so it must fit too.
  for (size_t space = begin + max_bytes - 1; space > begin; --space) {
    if (text[space] != ' ' || NextUtf8Char(text, space + 1).klass == CharClass::kSpace ||
        WhitespaceBefore(text, space)) {
      continue;
    }
    switch (space_at_cut) {
      case Tokenizer::SpaceAtCut::kStartsNext:
        return {.end = space, .next = space};
      case Tokenizer::SpaceAtCut::kEndsPrevious:
        return {.end = space + 1, .next = space + 1};
      case Tokenizer::SpaceAtCut::kDropped:
        return {.end = space, .next = space + 1};
    }
  }
  // No such space: the last character boundary that fits. A character is at most 4 bytes, so
  // one starts within 3 bytes before the limit unless the limit is inside a run of invalid
  // bytes, where every byte is a character of its own. A special token's text (which has no
  // spaces) is never cut: it would become text on both sides.
  const size_t limit = begin + max_bytes;
  size_t end = limit;
  while (end > limit - (kMinChunkBytes - 1) && IsContinuation(text[end])) --end;
  if (IsContinuation(text[end])) end = limit;
  end = OutsideSpecialToken(text, begin, end, special);
  return {.end = end, .next = end};
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> EncodeInChunks(const Tokenizer& tokenizer,
                                                    absl::string_view text,
                                                    size_t max_chunk_bytes) {
  const size_t max_bytes = std::max(max_chunk_bytes, kMinChunkBytes);
  if (text.size() <= max_bytes) return tokenizer.Encode(text);
  const Tokenizer::SpaceAtCut space_at_cut = tokenizer.space_at_cut();
  std::vector<int32_t> ids;
  size_t begin = 0;
  while (text.size() - begin > max_bytes) {
    const Cut cut = NextCut(text, begin, max_bytes, space_at_cut, tokenizer.special_token_text());
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
