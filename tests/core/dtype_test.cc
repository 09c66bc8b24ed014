// Tests of the fp16/bf16 conversions in core/half.h and the DType helpers in core/dtype.h.
//
// Every fp16 and bf16 bit pattern is checked exhaustively. The fp32 -> fp16/bf16 rounding is
// checked at every midpoint between adjacent representable values (where round-to-nearest-even
// decides) and on a few million random fp32 bit patterns against two independent references:
// GCC's _Float16 conversion (software, round-to-nearest-even) and a rounding written here in
// double arithmetic.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "core/dtype.h"
#include "core/half.h"
#include "gtest/gtest.h"
#include "tests/assert_ok.h"

namespace nf {
namespace {

uint32_t FloatBits(float f) { return std::bit_cast<uint32_t>(f); }
float BitsFloat(uint32_t b) { return std::bit_cast<float>(b); }

// ---- Independent references ---------------------------------------------------------------

// fp16 bits -> value, decoded from the fields in double: (-1)^s * 2^(e-15) * (1 + m/1024), or
// m * 2^-24 for subnormals. Returns NaN / inf for exponent 31.
double HalfReference(uint16_t h) {
  const int sign = h >> 15;
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  double magnitude;
  if (exponent == 0x1F) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN()
                         : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -24);
  } else {
    magnitude = std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  }
  return sign ? -magnitude : magnitude;
}

// bf16 bits -> value from the fields: (-1)^s * 2^(e-127) * (1 + m/128), or m * 2^-133.
double BFloat16Reference(uint16_t b) {
  const int sign = b >> 15;
  const int exponent = (b >> 7) & 0xFF;
  const int mantissa = b & 0x7F;
  double magnitude;
  if (exponent == 0xFF) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN()
                         : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -133);
  } else {
    magnitude = std::ldexp(1.0 + mantissa / 128.0, exponent - 127);
  }
  return sign ? -magnitude : magnitude;
}

// GCC's _Float16: fp32 -> fp16 is done by libgcc's soft-float __truncsfhf2 (or F16C), both
// round-to-nearest-even.
uint16_t GccFloatToHalfBits(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof(bits));
  return bits;
}

float GccHalfBitsToFloat(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, sizeof(bits));
  return static_cast<float>(h);
}

// Rounds the finite value d to a binary format with `precision` significand bits (counting the
// implicit one), smallest normal exponent `min_exponent` (value 2^min_exponent) and largest
// finite value `max_finite`, to nearest with ties to even, overflowing to infinity. All in
// double, which holds every fp32 value and every intermediate here exactly.
double RoundToFormat(double d, int precision, int min_exponent, double max_finite) {
  const double magnitude = std::fabs(d);
  double rounded = 0.0;
  if (magnitude != 0.0) {
    int e;
    std::frexp(magnitude, &e);  // magnitude in [2^(e-1), 2^e)
    // Spacing of representable values around magnitude; subnormals share the spacing of the
    // lowest binade.
    const int ulp_exponent = std::max(e - 1, min_exponent) - (precision - 1);
    const double ulp = std::ldexp(1.0, ulp_exponent);
    const double k = std::floor(magnitude / ulp);  // exact: magnitude / ulp is a power-of-2 scale
    const double below = k * ulp;
    const double above = (k + 1) * ulp;
    const double distance_below = magnitude - below;
    const double distance_above = above - magnitude;
    if (distance_below < distance_above) {
      rounded = below;
    } else if (distance_above < distance_below) {
      rounded = above;
    } else {
      // Tie: the candidate with the even significand. k and k + 1 are the significands in units
      // of ulp (above may be the next power of two, whose significand is even as well).
      rounded = std::fmod(k, 2.0) == 0.0 ? below : above;
    }
    // Past max_finite the next "representable" value would be 2^(emax+1), which the format
    // lacks: the rounding to it becomes infinity.
    if (rounded > max_finite) rounded = std::numeric_limits<double>::infinity();
  }
  return std::copysign(rounded, d);
}

constexpr double kMaxHalf = 65504.0;
const double kMaxBFloat16 = std::ldexp(255.0, 120);  // (2 - 2^-7) * 2^127 = 0x7F7F

double HalfRoundReference(float f) { return RoundToFormat(f, 11, -14, kMaxHalf); }
double BFloat16RoundReference(float f) { return RoundToFormat(f, 8, -126, kMaxBFloat16); }

// The bits of a value that is exactly representable in bf16 (checked): fp32 bits >> 16.
uint16_t BFloat16BitsOfExact(double value) {
  const float f = static_cast<float>(value);
  EXPECT_EQ(static_cast<double>(f), value);
  EXPECT_EQ(FloatBits(f) & 0xFFFFu, 0u) << value << " is not a bf16 value";
  return static_cast<uint16_t>(FloatBits(f) >> 16);
}

bool IsHalfNaN(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0; }
bool IsBFloat16NaN(uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu) != 0; }

// A few million random fp32 bit patterns: uniform over all 2^32 patterns (mostly outside fp16's
// range: these exercise overflow, underflow, NaN and inf) and uniform over the exponents fp16
// can round to (2^-26 .. 2^16) with random sign and mantissa.
constexpr int kRandomPatterns = 2'000'000;

uint32_t RandomPatternInHalfRange(std::mt19937& rng) {
  const uint32_t word = rng();
  const uint32_t exponent = 101 + rng() % 43;  // biased exponents 101..143: 2^-26 .. 2^16
  return (word & 0x807FFFFFu) | (exponent << 23);
}

// ---- fp16 ---------------------------------------------------------------------------------

TEST(HalfTest, EveryPatternDecodesExactly) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = HalfBitsToFloat(h);
    const double reference = HalfReference(h);
    if (IsHalfNaN(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << h;
      // Documented: the payload is kept (in the top mantissa bits) and the NaN is quiet.
      ASSERT_EQ((FloatBits(f) >> 13) & 0x3FFu, (h & 0x3FFu) | 0x200u) << std::hex << h;
      ASSERT_TRUE(std::isnan(GccHalfBitsToFloat(h)));
      continue;
    }
    // Exact equality, bitwise so that -0 and +0 are told apart.
    ASSERT_EQ(FloatBits(f), FloatBits(static_cast<float>(reference)))
        << std::hex << "h=" << h << " got " << f << " expected " << reference;
    ASSERT_EQ(static_cast<double>(f), reference) << std::hex << h;
    ASSERT_EQ(FloatBits(f), FloatBits(GccHalfBitsToFloat(h))) << std::hex << h;
  }
}

TEST(HalfTest, EveryPatternRoundTrips) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const uint16_t back = FloatToHalfBits(HalfBitsToFloat(h));
    if (IsHalfNaN(h)) {
      // NaN stays NaN with its sign and payload; only the quiet bit may be added.
      ASSERT_TRUE(IsHalfNaN(back)) << std::hex << h << " -> " << back;
      ASSERT_EQ(back, h | 0x0200u) << std::hex << h;
    } else {
      ASSERT_EQ(back, h) << std::hex << h;  // includes +-0 and +-inf
    }
  }
}

TEST(HalfTest, SpecialValues) {
  EXPECT_EQ(FloatToHalfBits(0.0f), 0x0000u);
  EXPECT_EQ(FloatToHalfBits(-0.0f), 0x8000u);
  EXPECT_EQ(FloatToHalfBits(std::numeric_limits<float>::infinity()), 0x7C00u);
  EXPECT_EQ(FloatToHalfBits(-std::numeric_limits<float>::infinity()), 0xFC00u);
  EXPECT_TRUE(IsHalfNaN(FloatToHalfBits(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(IsHalfNaN(FloatToHalfBits(-std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload lives only in the low fp32 mantissa bits must not become infinity.
  EXPECT_TRUE(IsHalfNaN(FloatToHalfBits(BitsFloat(0x7F800001u))));
  EXPECT_TRUE(IsHalfNaN(FloatToHalfBits(BitsFloat(0xFF800001u))));
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3C00u);
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xC000u);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7BFFu);
  EXPECT_EQ(FloatToHalfBits(0x1p-14f), 0x0400u);  // smallest normal
  EXPECT_EQ(FloatToHalfBits(0x1p-24f), 0x0001u);  // smallest subnormal
  EXPECT_EQ(HalfBitsToFloat(0x3555u), 0.333251953125f);
}

TEST(HalfTest, Overflow) {
  // 65520 is the midpoint between 65504 (max, odd mantissa 0x3FF) and 2^16: ties go to the even
  // "2^16", i.e. infinity. Anything below it rounds down to 65504.
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7C00u);
  EXPECT_EQ(FloatToHalfBits(-65520.0f), 0xFC00u);
  const float just_below = std::nextafter(65520.0f, 0.0f);  // 65519.996
  EXPECT_EQ(just_below, 65519.99609375f);
  EXPECT_EQ(FloatToHalfBits(just_below), 0x7BFFu);
  EXPECT_EQ(FloatToHalfBits(-just_below), 0xFBFFu);
  EXPECT_EQ(FloatToHalfBits(65536.0f), 0x7C00u);
  EXPECT_EQ(FloatToHalfBits(std::numeric_limits<float>::max()), 0x7C00u);
  EXPECT_EQ(FloatToHalfBits(-std::numeric_limits<float>::max()), 0xFC00u);
}

TEST(HalfTest, Underflow) {
  // 2^-25 is half the smallest subnormal (2^-24): a tie between 0 (even) and 0x0001 -> 0.
  EXPECT_EQ(FloatToHalfBits(0x1p-25f), 0x0000u);
  EXPECT_EQ(FloatToHalfBits(-0x1p-25f), 0x8000u);
  EXPECT_EQ(FloatToHalfBits(std::nextafter(0x1p-25f, 1.0f)), 0x0001u);
  EXPECT_EQ(FloatToHalfBits(-std::nextafter(0x1p-25f, 1.0f)), 0x8001u);
  for (float f : {std::nextafter(0x1p-25f, 0.0f), 0x1p-26f, 0x1p-40f, 0x1p-126f,
                  std::numeric_limits<float>::denorm_min()}) {
    EXPECT_EQ(FloatToHalfBits(f), 0x0000u) << f;
    EXPECT_EQ(FloatToHalfBits(-f), 0x8000u) << f;  // signed zero
  }
  // 1.5 * 2^-24 ties between 0x0001 (odd) and 0x0002 (even).
  EXPECT_EQ(FloatToHalfBits(0x1.8p-24f), 0x0002u);
  // Rounding up out of the subnormals into the smallest normal.
  EXPECT_EQ(FloatToHalfBits(std::nextafter(0x1p-14f, 0.0f)), 0x0400u);
}

// For every pair of adjacent finite fp16 values (both signs), the midpoint goes to the one with
// the even mantissa (the even bit pattern), and the fp32 values one ulp either side of it round
// to the nearer neighbour.
TEST(HalfTest, MidpointsRoundToNearestEven) {
  for (uint32_t i = 0; i < 0x7BFF; ++i) {
    for (uint16_t sign : {0x0000, 0x8000}) {
      const uint16_t low = static_cast<uint16_t>(i | sign);  // nearer zero
      const uint16_t high = static_cast<uint16_t>((i + 1) | sign);
      const double mid_exact = (HalfReference(low) + HalfReference(high)) / 2;
      const float mid = static_cast<float>(mid_exact);
      // An fp16 midpoint needs 12 significant bits (or is an odd multiple of 2^-25): fp32 holds it.
      ASSERT_EQ(static_cast<double>(mid), mid_exact) << std::hex << low;
      const uint16_t even = (low & 1u) == 0 ? low : high;
      ASSERT_EQ(FloatToHalfBits(mid), even) << std::hex << "midpoint of " << low << ", " << high;
      const float nearer_zero = std::nextafter(mid, 0.0f);
      const float farther = std::nextafter(mid, sign ? -INFINITY : INFINITY);
      ASSERT_EQ(FloatToHalfBits(nearer_zero), low) << std::hex << low;
      ASSERT_EQ(FloatToHalfBits(farther), high) << std::hex << low;
    }
  }
}

TEST(HalfTest, RandomFloatsMatchGccAndDoubleReference) {
  std::mt19937 rng(20240611);
  for (int i = 0; i < 2 * kRandomPatterns; ++i) {
    const uint32_t bits = i < kRandomPatterns ? rng() : RandomPatternInHalfRange(rng);
    const float f = BitsFloat(bits);
    const uint16_t h = FloatToHalfBits(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(IsHalfNaN(h)) << std::hex << bits;
      ASSERT_EQ(h >> 15, static_cast<int>(bits >> 31)) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(h, GccFloatToHalfBits(f)) << std::hex << "fp32 bits " << bits << " (" << f << ")";
    const double expected = HalfRoundReference(f);
    const float got = HalfBitsToFloat(h);
    ASSERT_EQ(static_cast<double>(got), expected) << std::hex << "fp32 bits " << bits;
    ASSERT_EQ(std::signbit(got), std::signbit(expected)) << std::hex << "fp32 bits " << bits;
  }
}

// ---- bf16 ---------------------------------------------------------------------------------

TEST(BFloat16Test, EveryPatternDecodesExactly) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = BFloat16BitsToFloat(b);
    // Documented as exact: the bf16 bits are the top half of the fp32 bits (NaNs included).
    ASSERT_EQ(FloatBits(f), i << 16) << std::hex << b;
    if (IsBFloat16NaN(b)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
    } else {
      ASSERT_EQ(static_cast<double>(f), BFloat16Reference(b)) << std::hex << b;
      ASSERT_EQ(std::signbit(f), (b & 0x8000u) != 0) << std::hex << b;
    }
  }
}

TEST(BFloat16Test, EveryPatternRoundTrips) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const uint16_t back = FloatToBFloat16Bits(BFloat16BitsToFloat(b));
    if (IsBFloat16NaN(b)) {
      // NaN stays NaN with its sign and payload; only the quiet bit may be added.
      ASSERT_TRUE(IsBFloat16NaN(back)) << std::hex << b << " -> " << back;
      ASSERT_EQ(back, b | 0x0040u) << std::hex << b;
    } else {
      ASSERT_EQ(back, b) << std::hex << b;  // includes +-0 and +-inf
    }
  }
}

TEST(BFloat16Test, SpecialValues) {
  EXPECT_EQ(FloatToBFloat16Bits(0.0f), 0x0000u);
  EXPECT_EQ(FloatToBFloat16Bits(-0.0f), 0x8000u);
  EXPECT_EQ(FloatToBFloat16Bits(1.0f), 0x3F80u);
  EXPECT_EQ(FloatToBFloat16Bits(std::numeric_limits<float>::infinity()), 0x7F80u);
  EXPECT_EQ(FloatToBFloat16Bits(-std::numeric_limits<float>::infinity()), 0xFF80u);
  // NaNs whose payload is only in the low 16 bits (truncation alone would give infinity), and
  // the all-ones NaN (adding a rounding bias would carry out of the word).
  for (uint32_t nan_bits :
       {0x7F800001u, 0xFF800001u, 0x7F80FFFFu, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FC00000u}) {
    const uint16_t b = FloatToBFloat16Bits(BitsFloat(nan_bits));
    EXPECT_TRUE(IsBFloat16NaN(b)) << std::hex << nan_bits << " -> " << b;
    EXPECT_EQ(b >> 15, static_cast<int>(nan_bits >> 31)) << std::hex << nan_bits;
  }
  // Overflow: the midpoint between the largest finite bf16 (0x7F7F, odd) and 2^128 ties to the
  // even "2^128", i.e. infinity; one fp32 ulp below it rounds down.
  EXPECT_EQ(FloatToBFloat16Bits(BitsFloat(0x7F7F8000u)), 0x7F80u);
  EXPECT_EQ(FloatToBFloat16Bits(BitsFloat(0xFF7F8000u)), 0xFF80u);
  EXPECT_EQ(FloatToBFloat16Bits(BitsFloat(0x7F7F7FFFu)), 0x7F7Fu);
  EXPECT_EQ(FloatToBFloat16Bits(std::numeric_limits<float>::max()), 0x7F80u);
  // Underflow keeps the sign: the smallest fp32 denormal is below half the smallest bf16
  // subnormal (2^-133).
  EXPECT_EQ(FloatToBFloat16Bits(std::numeric_limits<float>::denorm_min()), 0x0000u);
  EXPECT_EQ(FloatToBFloat16Bits(-std::numeric_limits<float>::denorm_min()), 0x8000u);
}

TEST(BFloat16Test, MidpointsRoundToNearestEven) {
  for (uint32_t i = 0; i < 0x7F7F; ++i) {
    for (uint16_t sign : {0x0000, 0x8000}) {
      const uint16_t low = static_cast<uint16_t>(i | sign);  // nearer zero
      const uint16_t high = static_cast<uint16_t>((i + 1) | sign);
      const double mid_exact = (BFloat16Reference(low) + BFloat16Reference(high)) / 2;
      const float mid = static_cast<float>(mid_exact);
      // 9 significant bits (or an odd multiple of 2^-134): exact in fp32.
      ASSERT_EQ(static_cast<double>(mid), mid_exact) << std::hex << low;
      const uint16_t even = (low & 1u) == 0 ? low : high;
      ASSERT_EQ(FloatToBFloat16Bits(mid), even)
          << std::hex << "midpoint of " << low << ", " << high;
      const float nearer_zero = std::nextafter(mid, 0.0f);
      const float farther = std::nextafter(mid, sign ? -INFINITY : INFINITY);
      ASSERT_EQ(FloatToBFloat16Bits(nearer_zero), low) << std::hex << low;
      ASSERT_EQ(FloatToBFloat16Bits(farther), high) << std::hex << low;
    }
  }
}

TEST(BFloat16Test, RandomFloatsMatchDoubleReference) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2 * kRandomPatterns; ++i) {
    uint32_t bits = rng();
    if (i >= kRandomPatterns) {
      // Half of them with the low 16 bits near the tie 0x8000, where rounding is decided.
      bits = (bits & 0xFFFF0000u) | (0x8000u + (rng() % 5) - 2);
    }
    const float f = BitsFloat(bits);
    const uint16_t b = FloatToBFloat16Bits(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(IsBFloat16NaN(b)) << std::hex << bits;
      ASSERT_EQ(b >> 15, static_cast<int>(bits >> 31)) << std::hex << bits;
      continue;
    }
    const double expected = BFloat16RoundReference(f);
    ASSERT_EQ(b, BFloat16BitsOfExact(expected))
        << std::hex << "fp32 bits " << bits << " (" << f << "), expected " << expected;
  }
}

// ---- ToFloat / FromFloat ------------------------------------------------------------------

TEST(HalfTest, ToFloatFromFloatWrappers) {
  EXPECT_EQ(FromFloat<Half>(1.5f).bits, 0x3E00u);
  EXPECT_EQ(FromFloat<BFloat16>(1.5f).bits, 0x3FC0u);
  EXPECT_EQ(FromFloat<float>(1.25f), 1.25f);
  EXPECT_EQ(ToFloat(Half{0xC000u}), -2.0f);
  EXPECT_EQ(ToFloat(BFloat16{0xC000u}), -2.0f);
  EXPECT_EQ(ToFloat(3.5f), 3.5f);
}

// ---- DType --------------------------------------------------------------------------------

TEST(DTypeTest, SizeOf) {
  EXPECT_EQ(SizeOf(DType::kF32), 4u);
  EXPECT_EQ(SizeOf(DType::kF16), 2u);
  EXPECT_EQ(SizeOf(DType::kBF16), 2u);
  EXPECT_EQ(SizeOf(DType::kI32), 4u);
  EXPECT_EQ(SizeOf(DType::kI64), 8u);
  EXPECT_EQ(SizeOf(DType::kU16), 2u);
  EXPECT_EQ(SizeOf(DType::kU8), 1u);
  EXPECT_EQ(SizeOf(DType::kF64), 8u);
  EXPECT_EQ(sizeof(Half), 2u);
  EXPECT_EQ(sizeof(BFloat16), 2u);
}

TEST(DTypeTest, NameRoundTrip) {
  const struct {
    DType dtype;
    const char* name;
    bool floating;
  } kCases[] = {
      {DType::kF32, "f32", true},  {DType::kF16, "f16", true},  {DType::kBF16, "bf16", true},
      {DType::kI32, "i32", false}, {DType::kI64, "i64", false}, {DType::kU16, "u16", false},
      {DType::kU8, "u8", false},   {DType::kF64, "f64", false},
  };
  for (const auto& c : kCases) {
    EXPECT_EQ(DTypeName(c.dtype), c.name);
    auto parsed = ParseDType(DTypeName(c.dtype));
    NF_ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, c.dtype) << c.name;
    EXPECT_EQ(IsFloating(c.dtype), c.floating) << c.name;
  }
}

TEST(DTypeTest, ParseAliases) {
  const struct {
    const char* name;
    DType dtype;
  } kAliases[] = {
      {"fp32", DType::kF32},    {"float32", DType::kF32},   {"fp16", DType::kF16},
      {"float16", DType::kF16}, {"bfloat16", DType::kBF16},
  };
  for (const auto& a : kAliases) {
    auto parsed = ParseDType(a.name);
    NF_ASSERT_OK(parsed) << a.name;
    EXPECT_EQ(*parsed, a.dtype) << a.name;
  }
}

TEST(DTypeTest, UnknownNameIsAnError) {
  for (const char* name : {"float8", "F32", "", "bf16 ", "int"}) {
    auto parsed = ParseDType(name);
    ASSERT_FALSE(parsed.ok()) << "'" << name << "' parsed";
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(parsed.status().message()).find(std::string("'") + name + "'"),
              std::string::npos)
        << parsed.status();
  }
}

}  // namespace
}  // namespace nf
