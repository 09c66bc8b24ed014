#include "data/masked_lm.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "core/philox.h"

namespace nf::data {
namespace {

// What a Philox call draws, the low byte of its last counter word (the bytes above count
// rejected attempts): counter = {index, sample low, sample high, kind | attempt << 8}.
enum DrawKind : uint32_t {
  kCountDraw = 0,    // index 0: the u of MaskedCount
  kChoiceDraw = 1,   // index = Fisher-Yates step
  kOutcomeDraw = 2,  // index = position: <mask>, random token or unchanged
  kTokenDraw = 3,    // index = position: the random token
};

PhiloxCounter Words(uint32_t seed, uint64_t sample, DrawKind kind, uint32_t index,
                    uint32_t attempt) {
  return Philox4x32_10({index, static_cast<uint32_t>(sample), static_cast<uint32_t>(sample >> 32),
                        kind | attempt << 8},
                       {seed, kMaskedLmStream});
}

uint64_t Join(uint32_t low, uint32_t high) { return static_cast<uint64_t>(high) << 32 | low; }

// A uniform double in [0, 1) from the top 53 bits of a 64-bit draw.
double Unit(uint64_t draw) { return static_cast<double>(draw >> 11) * 0x1p-53; }

// A uniform integer in [0, bound), bound >= 1. Unbiased: 64-bit draws below 2^64 mod bound
// would favour small results and are redrawn (for bound < 2^31, with probability < 2^-33).
uint64_t UniformBelow(uint64_t bound, uint32_t seed, uint64_t sample, DrawKind kind,
                      uint32_t index) {
  const uint64_t reject_below = (0 - bound) % bound;
  for (uint32_t attempt = 0;; ++attempt) {
    const PhiloxCounter words = Words(seed, sample, kind, index, attempt);
    for (int half = 0; half < 2; ++half) {
      const uint64_t draw = Join(words[2 * half], words[2 * half + 1]);
      if (draw >= reject_below) return draw % bound;
    }
  }
}

// The input at chosen position `position`, whose original is `token`.
int32_t Corrupted(const MaskedLmSpec& spec, uint64_t sample, uint32_t position, int32_t token) {
  const PhiloxCounter words = Words(spec.seed, sample, kOutcomeDraw, position, 0);
  const double u = Unit(Join(words[0], words[1]));
  if (u < spec.leave_unmasked_prob) return token;
  if (u < spec.leave_unmasked_prob + spec.random_token_prob) {
    // Uniform over the vocabulary less <mask>: draw among vocab_size - 1 ids, skip <mask>.
    const auto drawn = static_cast<int32_t>(UniformBelow(static_cast<uint64_t>(spec.vocab_size - 1),
                                                         spec.seed, sample, kTokenDraw, position));
    return drawn < spec.mask_token ? drawn : drawn + 1;
  }
  return spec.mask_token;
}

}  // namespace

int64_t MaskedCount(double mask_prob, int64_t seq_len, double u) {
  const auto n = static_cast<int64_t>(std::floor(mask_prob * static_cast<double>(seq_len) + u));
  return std::clamp<int64_t>(n, 0, seq_len);
}

double MaskedCountUniform(uint32_t seed, uint64_t sample) {
  const PhiloxCounter words = Words(seed, sample, kCountDraw, 0, 0);
  return Unit(Join(words[0], words[1]));
}

void MaskSample(const MaskedLmSpec& spec, uint64_t sample, std::span<const int32_t> tokens,
                std::span<int32_t> inputs, std::span<int32_t> targets) {
  const auto length = static_cast<int64_t>(tokens.size());
  const int64_t n = MaskedCount(spec.mask_prob, length, MaskedCountUniform(spec.seed, sample));
  // A partial Fisher-Yates shuffle of the positions, in targets: step i swaps a uniform pick
  // among positions [i, L) into slot i, so targets[0, n) end up a uniform n-subset.
  std::iota(targets.begin(), targets.end(), 0);
  for (int64_t i = 0; i < n; ++i) {
    const auto j =
        i + static_cast<int64_t>(UniformBelow(static_cast<uint64_t>(length - i), spec.seed, sample,
                                              kChoiceDraw, static_cast<uint32_t>(i)));
    std::swap(targets[i], targets[j]);
  }
  // inputs flags the chosen positions (1) until each is overwritten below.
  std::fill(inputs.begin(), inputs.end(), 0);
  for (int64_t i = 0; i < n; ++i) inputs[targets[i]] = 1;
  for (int64_t p = 0; p < length; ++p) {
    if (inputs[p] == 0) {
      inputs[p] = tokens[p];
      targets[p] = -1;
    } else {
      inputs[p] = Corrupted(spec, sample, static_cast<uint32_t>(p), tokens[p]);
      targets[p] = tokens[p];
    }
  }
}

}  // namespace nf::data
