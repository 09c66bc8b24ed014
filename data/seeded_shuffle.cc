#include "data/seeded_shuffle.h"

#include <utility>

#include "core/philox.h"

namespace nf::data {

uint64_t UniformBelow(uint64_t bound, uint32_t seed, uint32_t stream, uint32_t block, uint64_t i) {
  // 2^64 mod bound: draws below it are the surplus that would favour small results.
  const uint64_t reject_below = (0 - bound) % bound;
  for (uint32_t attempt = 0;; ++attempt) {
    const PhiloxCounter words = Philox4x32_10(
        {static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), block, attempt}, {seed, stream});
    // One Philox call gives two 64-bit draws; both are rejected with probability < 2^-64 for
    // the sizes shuffled here.
    for (int half = 0; half < 2; ++half) {
      const uint64_t draw = (static_cast<uint64_t>(words[2 * half + 1]) << 32) | words[2 * half];
      if (draw >= reject_below) return draw % bound;
    }
  }
}

void SeededShuffle(std::span<int64_t> values, uint32_t seed, uint32_t stream, uint32_t block) {
  for (uint64_t i = values.size(); i > 1; --i) {
    // Fisher-Yates: position i - 1 takes a uniform pick among the first i.
    const uint64_t j = UniformBelow(i, seed, stream, block, i - 1);
    std::swap(values[i - 1], values[j]);
  }
}

}  // namespace nf::data
