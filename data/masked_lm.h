// A masked LM's sample corruption, after RoBERTa (Liu et al. 2019) as fairseq's
// MaskTokensDataset implements it: of a sample's L tokens, n = floor(mask_prob L + u) distinct
// positions are chosen uniformly (u uniform in [0, 1), so n averages mask_prob L); each chosen
// token becomes <mask> with probability 1 - random_token_prob - leave_unmasked_prob, a uniformly
// drawn token with probability random_token_prob, and stays as it is with probability
// leave_unmasked_prob. The targets hold the original token at every chosen position (whatever
// became of its input) and -1, "no loss here", everywhere else.
//
// Differences from fairseq: the random replacement is uniform over the whole vocabulary except
// <mask> (fairseq's excludes its dictionary's special symbols; this project keeps no such list),
// and "no target" is -1 rather than the padding id. RoBERTa's token-level masking only: fairseq's
// optional whole-word and span variants (mask_whole_words, mask_multiple_length) are other
// objectives.
//
// Every draw is a pure function of (seed, sample, what is drawn), through the counter-based
// Philox of core/philox.h, never a std:: engine: a sample's mask is the same whatever the
// data-parallel layout, micro-batch size, thread count or resume point. Its key,
// {seed, kMaskedLmStream}, is one no dropout site (1 + 4 layer + kind) nor initialisation reaches,
// so masks never correlate with dropout masks or initial weights.
//
// The n positions come from a partial Fisher-Yates shuffle of [0, L) whose step i draws a uniform
// index in [i, L) keyed by (sample, i): every n-subset is equally likely, the positions are
// exactly n and distinct by construction (no rejection loop, no ties to break), it costs n draws
// rather than L, and the permutation it needs fits in the targets row, so masking allocates
// nothing. Each chosen position's outcome (and replacement token) is keyed by (sample, position).
#pragma once

#include <cstdint>
#include <span>

namespace nf::data {

// The second Philox key word of the masks: one below initialisation's (model/param_table.cc),
// far above any dropout site.
inline constexpr uint32_t kMaskedLmStream = 0xFFFFFFFEu;

struct MaskedLmSpec {
  // data.masked_lm's rates: 0 < mask_prob <= 1; random_token_prob, leave_unmasked_prob >= 0
  // with a sum <= 1 (launcher/config_validation.cc checks them).
  double mask_prob = 0.15;
  double random_token_prob = 0.1;
  double leave_unmasked_prob = 0.1;
  int32_t mask_token = 0;  // <mask>, in [0, vocab_size)
  int64_t vocab_size = 0;  // >= 2: a random replacement needs a token other than <mask>
  uint32_t seed = 0;       // train.seed
};

// How many of `seq_len` positions are chosen for draw u in [0, 1): floor(mask_prob seq_len + u),
// at most seq_len (fairseq's int(mask_prob * sz + np.random.rand())).
int64_t MaskedCount(double mask_prob, int64_t seq_len, double u);

// The u of `sample`'s MaskedCount: uniform in [0, 1), in steps of 2^-53.
double MaskedCountUniform(uint32_t seed, uint64_t sample);

// Corrupts sample `sample` (its global stream index) of tokens[L] into inputs[L] and targets[L]
// (original id at chosen positions, -1 elsewhere). The three spans have the same length L < 2^31
// and do not overlap.
void MaskSample(const MaskedLmSpec& spec, uint64_t sample, std::span<const int32_t> tokens,
                std::span<int32_t> inputs, std::span<int32_t> targets);

}  // namespace nf::data
