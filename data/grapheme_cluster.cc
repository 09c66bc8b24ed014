#include "data/grapheme_cluster.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "data/unicode_class.h"

namespace nf::data {
namespace {

struct Range {
  uint32_t first;
  uint32_t last;
};

// Sorted, disjoint ranges of code points that continue the cluster before them.
constexpr Range kExtend[] = {
#include "data/grapheme_extend.inc"
};

// Not a code point: an invalid byte, a cluster of its own.
constexpr uint32_t kInvalid = 0xFFFFFFFF;

// The code point of the character NextUtf8Char reads at text[pos], or kInvalid.
uint32_t CodePointAt(absl::string_view text, size_t pos) {
  const Utf8Char c = NextUtf8Char(text, pos);
  const auto lead = static_cast<unsigned char>(text[pos]);
  if (c.length == 1) return lead < 0x80 ? lead : kInvalid;
  uint32_t code_point = lead & (c.length == 2 ? 0x1F : c.length == 3 ? 0x0F : 0x07);
  for (int i = 1; i < c.length; ++i) {
    code_point = (code_point << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
  }
  return code_point;
}

bool IsControl(uint32_t c) {
  return c < 0x20 || (c >= 0x7F && c <= 0x9F) || c == 0x2028 || c == 0x2029;
}

bool Extends(uint32_t c) {
  if (c < 0x300) return false;
  const Range* it =
      std::lower_bound(std::begin(kExtend), std::end(kExtend), c,
                       [](const Range& range, uint32_t value) { return range.last < value; });
  return it != std::end(kExtend) && it->first <= c;
}

bool IsRegionalIndicator(uint32_t c) { return c >= 0x1F1E6 && c <= 0x1F1FF; }

// Hangul_Syllable_Type.
enum class Hangul { kNone, kL, kV, kT, kLV, kLVT };

Hangul HangulType(uint32_t c) {
  if ((c >= 0x1100 && c <= 0x115F) || (c >= 0xA960 && c <= 0xA97C)) return Hangul::kL;
  if ((c >= 0x1160 && c <= 0x11A7) || (c >= 0xD7B0 && c <= 0xD7C6)) return Hangul::kV;
  if ((c >= 0x11A8 && c <= 0x11FF) || (c >= 0xD7CB && c <= 0xD7FB)) return Hangul::kT;
  if (c >= 0xAC00 && c <= 0xD7A3) return (c - 0xAC00) % 28 == 0 ? Hangul::kLV : Hangul::kLVT;
  return Hangul::kNone;
}

// GB6 to GB8: L x (L | V | LV | LVT), (LV | V) x (V | T), (LVT | T) x T.
bool JoinsHangul(uint32_t before, uint32_t after) {
  const Hangul a = HangulType(before);
  const Hangul b = HangulType(after);
  switch (a) {
    case Hangul::kL:
      return b == Hangul::kL || b == Hangul::kV || b == Hangul::kLV || b == Hangul::kLVT;
    case Hangul::kV:
    case Hangul::kLV:
      return b == Hangul::kV || b == Hangul::kT;
    case Hangul::kT:
    case Hangul::kLVT:
      return b == Hangul::kT;
    case Hangul::kNone:
      return false;
  }
  return false;
}

}  // namespace

bool IsGraphemeClusterBoundary(absl::string_view text, size_t at) {
  if (at == 0 || at >= text.size()) return true;
  const uint32_t before = CodePointAt(text, PreviousUtf8CharStart(text, at));
  const uint32_t after = CodePointAt(text, at);
  if (before == kInvalid || after == kInvalid) return true;
  if (before == '\r' && after == '\n') return false;                  // GB3
  if (IsControl(before) || IsControl(after)) return true;             // GB4, GB5
  if (JoinsHangul(before, after)) return false;                       // GB6 to GB8
  if (Extends(after)) return false;                                   // GB9, GB9a
  if (before == 0x200D) return false;                                 // GB11, broadly
  if (IsRegionalIndicator(before) && IsRegionalIndicator(after)) {    // GB12, GB13, broadly
    return false;
  }
  return true;                                                        // GB999
}

}  // namespace nf::data
