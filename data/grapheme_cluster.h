// Where a text may be cut without splitting a user-perceived character: between extended
// grapheme clusters (Unicode's UAX #29), so that a base character and the combining marks that
// follow it (e + U+0301, a Devanagari consonant and its vowel signs, an emoji and its modifier)
// and a Hangul syllable's jamo stay in one piece. A tokenizer's normalizer (NFKC) composes such a
// sequence into one character, which a cut inside it would prevent, changing the text.
#pragma once

#include <cstddef>

#include "absl/strings/string_view.h"

namespace nf::data {

// Whether `at` (a character boundary as NextUtf8Char reads the text, 0 <= at <= text.size())
// is between two extended grapheme clusters. True at either end, next to an invalid byte, and
// before or after a control character (CR LF aside); false before a combining mark, ZWJ, ZWNJ,
// an emoji modifier or a tag character (data/grapheme_extend.inc), after ZWJ, between two
// regional indicators and inside a Hangul syllable's L V T sequence. Two of UAX #29's rules are
// read more broadly, never cutting where it would: everything after a ZWJ continues the
// cluster (GB11 asks for an emoji after it), and so does every regional indicator after one
// (GB12/13 cut between pairs). Prepend characters (GB9b, a few Indic signs) are not looked at.
bool IsGraphemeClusterBoundary(absl::string_view text, size_t at);

}  // namespace nf::data
