#include "data/unicode_class.h"

#include <algorithm>
#include <iterator>

namespace nf::data {
namespace {

struct Range {
  uint32_t first;
  uint32_t last;
  CharClass klass;
};

// Short names keep the generated table dense (four ranges a line).
constexpr CharClass L = CharClass::kLetter;
constexpr CharClass N = CharClass::kNumber;

// Sorted, disjoint ranges of letters and numbers.
constexpr Range kRanges[] = {
#include "data/unicode_classes.inc"
};

bool IsWhiteSpace(uint32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

}  // namespace

CharClass ClassifyCodePoint(uint32_t code_point) {
  // ASCII is most of the text: answer it without the search.
  if (code_point < 0x80) {
    const char c = static_cast<char>(code_point);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::kLetter;
    if (c >= '0' && c <= '9') return CharClass::kNumber;
    return IsWhiteSpace(code_point) ? CharClass::kSpace : CharClass::kOther;
  }
  if (IsWhiteSpace(code_point)) return CharClass::kSpace;
  // The first range whose last code point is >= code_point holds it, if any does.
  const Range* it =
      std::lower_bound(std::begin(kRanges), std::end(kRanges), code_point,
                       [](const Range& range, uint32_t value) { return range.last < value; });
  if (it != std::end(kRanges) && it->first <= code_point) return it->klass;
  return CharClass::kOther;
}

Utf8Char NextUtf8Char(absl::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[pos + i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return {.klass = ClassifyCodePoint(lead), .length = 1};
  constexpr Utf8Char kInvalid = {.klass = CharClass::kOther, .length = 1};
  int length;
  uint32_t code_point;
  uint32_t min;  // the smallest code point of this length: smaller ones are overlong forms
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, code_point = lead & 0x1F, min = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, code_point = lead & 0x0F, min = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, code_point = lead & 0x07, min = 0x10000;
  } else {
    return kInvalid;  // a continuation byte, an overlong lead (C0, C1) or beyond U+10FFFF
  }
  if (text.size() - pos < static_cast<size_t>(length)) return kInvalid;
  for (int i = 1; i < length; ++i) {
    if (!IsUtf8Continuation(static_cast<char>(byte(i)))) return kInvalid;
    code_point = (code_point << 6) | (byte(i) & 0x3F);
  }
  if (code_point < min || code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF)) {
    return kInvalid;
  }
  return {.klass = ClassifyCodePoint(code_point), .length = length};
}

size_t PreviousUtf8CharStart(absl::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && IsUtf8Continuation(text[start])) {
    --start;
  }
  return start + NextUtf8Char(text, start).length == end ? start : end - 1;
}

}  // namespace nf::data
