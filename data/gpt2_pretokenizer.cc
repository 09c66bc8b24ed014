#include "data/gpt2_pretokenizer.h"

#include "absl/strings/match.h"
#include "data/unicode_class.h"

namespace nf::data {
namespace {

// The contraction alternatives, in the pattern's order (case-sensitive, as in GPT-2: "'S" is
// punctuation followed by a letter).
constexpr absl::string_view kContractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};

// The end of the run of `klass` characters starting at `pos`.
size_t RunEnd(absl::string_view text, size_t pos, CharClass klass) {
  while (pos < text.size()) {
    const Utf8Char c = NextUtf8Char(text, pos);
    if (c.klass != klass) break;
    pos += c.length;
  }
  return pos;
}

// The end of the pattern's match at `pos` (< text.size()); every character matches some
// alternative, so there is always one and it is never empty.
size_t MatchEnd(absl::string_view text, size_t pos) {
  const absl::string_view rest = text.substr(pos);
  if (rest[0] == '\'') {
    for (absl::string_view contraction : kContractions) {
      if (absl::StartsWith(rest, contraction)) return pos + contraction.size();
    }
  }
  const Utf8Char first = NextUtf8Char(text, pos);
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+` without the optional space: the first character
  // selects the one alternative that can match, and its run is greedy.
  if (first.klass != CharClass::kSpace) return RunEnd(text, pos + first.length, first.klass);
  // The same with the space: one ASCII space (only U+0020) joins the non-space run after it.
  if (rest[0] == ' ' && rest.size() > 1) {
    const Utf8Char next = NextUtf8Char(text, pos + 1);
    if (next.klass != CharClass::kSpace) return RunEnd(text, pos + 1 + next.length, next.klass);
  }
  // A whitespace run. `\s+(?!\S)` takes it whole at the end of the text; before a non-space it
  // backtracks one character, leaving the last whitespace character to the next match (where a
  // space joins the following word, as in "a  b" -> "a", " ", " b"). A single whitespace
  // character before a non-space fails the lookahead and is `\s+` alone.
  size_t last = pos;  // start of the run's last character
  size_t end = pos + first.length;
  while (end < text.size()) {
    const Utf8Char c = NextUtf8Char(text, end);
    if (c.klass != CharClass::kSpace) break;
    last = end;
    end += c.length;
  }
  if (end == text.size() || last == pos) return end;
  return last;
}

}  // namespace

std::vector<absl::string_view> Gpt2PreTokenize(absl::string_view text) {
  std::vector<absl::string_view> pieces;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = MatchEnd(text, pos);
    pieces.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

}  // namespace nf::data
