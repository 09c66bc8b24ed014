// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator, so any element's random word is a pure function of (key, counter)
// and can be computed on any rank, CPU or GPU, in any order. The CPU and CUDA kernels call
// these same functions, so their dropout masks agree bit for bit.
//
// Dropout keys its masks by global coordinates, never by rank (docs/design.md section 3):
//   key     = {seed, site}                 site: which dropout in the network (layer, kind)
//   counter = {col / 4, row, head, sample} one Philox call yields the words of 4 columns
// where sample is the global sample index, row the position (or query position), head the
// global head index (0 outside attention) and col the global feature (or key position).
// A tensor-parallel shard therefore draws exactly the bits the unsharded tensor would.
#pragma once

#include <array>
#include <cstdint>

#include "core/host_device.h"

namespace nf {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

NF_HOST_DEVICE inline PhiloxCounter Philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u;
  constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * counter[0];
    const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * counter[2];
    const uint32_t hi0 = static_cast<uint32_t>(product0 >> 32);
    const uint32_t lo0 = static_cast<uint32_t>(product0);
    const uint32_t hi1 = static_cast<uint32_t>(product1 >> 32);
    const uint32_t lo1 = static_cast<uint32_t>(product1);
    counter = {hi1 ^ counter[1] ^ key[0], lo1, hi0 ^ counter[3] ^ key[1], lo0};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return counter;
}

// The random words of the 4 columns [col & ~3, (col & ~3) + 4) at the given coordinates.
NF_HOST_DEVICE inline PhiloxCounter DropoutWords(uint32_t seed, uint32_t site, uint64_t sample,
                                                 uint64_t head, uint64_t row, uint64_t col) {
  return Philox4x32_10({static_cast<uint32_t>(col >> 2), static_cast<uint32_t>(row),
                        static_cast<uint32_t>(head), static_cast<uint32_t>(sample)},
                       {seed, site});
}

// An element is kept when its word is >= this threshold, i.e. with probability 1 - p
// (exactly, up to p's quantisation to multiples of 2^-32). Requires 0 <= p < 1.
NF_HOST_DEVICE inline uint32_t DropoutThreshold(float p) {
  const double scaled = static_cast<double>(p) * 4294967296.0;
  return scaled >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(scaled);
}

}  // namespace nf
