// IEEE binary16 (fp16) and bfloat16 storage types with round-to-nearest-even conversions from
// fp32. Conversions to fp32 are exact. NaN stays NaN (quiet), infinities and signed zeros are
// preserved, fp16 subnormals are produced and read exactly. Bit-twiddling only, so the same
// results come out on every CPU and match the GPU's hardware conversions.
#pragma once

#include <bit>
#include <cstdint>

namespace nf {

struct Half {
  uint16_t bits = 0;
};

struct BFloat16 {
  uint16_t bits = 0;
};

inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) {  // inf or NaN: keep the payload, force quiet
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13) |
                                (mantissa ? 0x00400000u : 0u));
  }
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // Subnormal: value = mantissa * 2^-24, exactly representable in fp32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t FloatToHalfBits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) {  // NaN: keep the top payload bits, force quiet
    return sign | 0x7E00u | static_cast<uint16_t>((abs >> 13) & 0x3FFu);
  }
  if (abs >= 0x477FF000u) {  // >= 65520 (halfway past the largest fp16, 65504): inf
    return sign | 0x7C00u;
  }
  if (abs < 0x38800000u) {  // below 2^-14, the smallest normal fp16: subnormal or zero
    // Scale into units of 2^-24 (the subnormal step); fp32 addition of 0.5 is exact-ish so
    // do the rounding in integers instead: shift the 24-bit significand.
    if (abs < 0x33000000u) return sign;  // below 2^-25: rounds to zero (2^-25 ties to even 0)
    const uint32_t exponent = abs >> 23;
    const uint32_t significand = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24 for exponents 102..112
    const uint32_t kept = significand >> shift;
    const uint32_t rest = significand & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    const uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
    return sign | static_cast<uint16_t>(rounded);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even. A carry
  // out of the mantissa correctly bumps the exponent (up to inf, excluded above).
  const uint32_t rebiased = abs - 0x38000000u;  // exponent - 112
  const uint32_t lsb = (rebiased >> 13) & 1u;
  return sign | static_cast<uint16_t>((rebiased + 0xFFFu + lsb) >> 13);
}

inline float BFloat16BitsToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t FloatToBFloat16Bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: truncate the payload, force quiet
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  const uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7FFFu + lsb) >> 16);
}

inline float ToFloat(float x) { return x; }
inline float ToFloat(Half x) { return HalfBitsToFloat(x.bits); }
inline float ToFloat(BFloat16 x) { return BFloat16BitsToFloat(x.bits); }

// FromFloat<T>(f): fp32 -> T with round-to-nearest-even.
template <typename T>
T FromFloat(float f);
template <>
inline float FromFloat<float>(float f) {
  return f;
}
template <>
inline Half FromFloat<Half>(float f) {
  return Half{FloatToHalfBits(f)};
}
template <>
inline BFloat16 FromFloat<BFloat16>(float f) {
  return BFloat16{FloatToBFloat16Bits(f)};
}

}  // namespace nf
