#include "core/non_finite.h"

#include <cstring>

namespace nf {
namespace {

// Elements of type Bits whose exponent field (`exponent` mask) is all ones.
template <typename Bits>
NonFinite Scan(const void* data, int64_t count, Bits exponent) {
  NonFinite found;
  const char* bytes = static_cast<const char*>(data);
  for (int64_t i = 0; i < count; ++i) {
    Bits bits;
    std::memcpy(&bits, bytes + i * static_cast<int64_t>(sizeof(Bits)), sizeof(Bits));
    if ((bits & exponent) != exponent) continue;
    if (found.count++ == 0) found.first = i;
  }
  return found;
}

}  // namespace

NonFinite FindNonFinite(const void* data, int64_t count, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return Scan<uint32_t>(data, count, 0x7f800000u);
    case DType::kF16:
      return Scan<uint16_t>(data, count, 0x7c00u);
    case DType::kBF16:
      return Scan<uint16_t>(data, count, 0x7f80u);
    case DType::kF64:
      return Scan<uint64_t>(data, count, 0x7ff0000000000000u);
    default:
      return {};
  }
}

}  // namespace nf
