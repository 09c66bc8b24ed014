#include "checkpoint/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace nf::checkpoint {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // CRC-32C, reflected

// tables[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t;
  constexpr Tables() : t() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t crc = b;
      for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
      t[0][b] = crc;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
    }
  }
};
constexpr Tables kTables;

#if defined(__x86_64__)
// The CRC32 instruction takes 3 cycles but can start one per cycle, so one dependent chain
// runs at a third of its speed: the hardware path checksums three independent streams of
// kStreamBytes at once and joins them. Joining needs the register advanced over kStreamBytes
// zero bytes, a linear map of the 32-bit register, tabulated per register byte.
constexpr size_t kStreamBytes = 2048;

// The raw (not inverted) register after `count` zero bytes, bit by bit.
constexpr uint32_t AdvanceOverZeros(uint32_t crc, size_t count) {
  for (size_t i = 0; i < count; ++i) crc = (crc >> 8) ^ kTables.t[0][crc & 0xFFu];
  return crc;
}

struct ZerosShift {
  std::array<std::array<uint32_t, 256>, 4> t;  // t[k][b]: byte b of the register at byte k
  ZerosShift() : t() {
    std::array<uint32_t, 32> bit;  // the map applied to each single-bit register
    for (int i = 0; i < 32; ++i) bit[i] = AdvanceOverZeros(1u << i, kStreamBytes);
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t shifted = 0;
        for (int i = 0; i < 8; ++i) {
          if (b & (1u << i)) shifted ^= bit[8 * k + i];
        }
        t[k][b] = shifted;
      }
    }
  }
  uint32_t operator()(uint32_t crc) const {
    return t[0][crc & 0xFFu] ^ t[1][(crc >> 8) & 0xFFu] ^ t[2][(crc >> 16) & 0xFFu] ^
           t[3][crc >> 24];
  }
};

__attribute__((target("sse4.2"))) uint64_t OneStream(const unsigned char* p, size_t words,
                                                     uint64_t c) {
  for (size_t i = 0; i < words; ++i) {
    uint64_t word;
    std::memcpy(&word, p + 8 * i, 8);
    c = _mm_crc32_u64(c, word);
  }
  return c;
}

// SSE4.2's CRC32 instruction computes CRC-32C, 8 bytes per instruction; chosen at run time so
// the build keeps the portable x86-64 baseline.
__attribute__((target("sse4.2"))) uint32_t HardwareCrc32c(const unsigned char* p, size_t size,
                                                          uint32_t crc) {
  static const ZerosShift shift;
  uint64_t c = ~crc;
  constexpr size_t kWords = kStreamBytes / 8;
  while (size >= 3 * kStreamBytes) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kWords; ++i) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, p + 8 * i, 8);
      std::memcpy(&w1, p + kStreamBytes + 8 * i, 8);
      std::memcpy(&w2, p + 2 * kStreamBytes + 8 * i, 8);
      c = _mm_crc32_u64(c, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    // crc(A B) = (crc(A) advanced over |B| zeros) ^ crc(B) from a zero register.
    const uint32_t joined = shift(shift(static_cast<uint32_t>(c)) ^ static_cast<uint32_t>(c1)) ^
                            static_cast<uint32_t>(c2);
    c = joined;
    p += 3 * kStreamBytes;
    size -= 3 * kStreamBytes;
  }
  c = OneStream(p, size / 8, c);
  p += size / 8 * 8;
  size %= 8;
  uint32_t c32 = static_cast<uint32_t>(c);
  while (size-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

const bool kHasSse42 = __builtin_cpu_supports("sse4.2");
#endif

}  // namespace

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (kHasSse42) return HardwareCrc32c(p, size, crc);
#endif
  return Crc32cPortable(p, size, crc);
}

uint32_t Crc32cPortable(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  const auto& t = kTables.t;
  crc = ~crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian x86-64 and aarch64
    word ^= crc;
    crc = t[7][word & 0xFF] ^ t[6][(word >> 8) & 0xFF] ^ t[5][(word >> 16) & 0xFF] ^
          t[4][(word >> 24) & 0xFF] ^ t[3][(word >> 32) & 0xFF] ^ t[2][(word >> 40) & 0xFF] ^
          t[1][(word >> 48) & 0xFF] ^ t[0][word >> 56];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFFu];
  return ~crc;
}

}  // namespace nf::checkpoint
