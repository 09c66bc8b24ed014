// How nf-generate picks each next token from the model's logits: greedy (the argmax) or a seeded
// draw from the softmax after temperature, top-k and top-p (nucleus) truncation.
//
// The draw is reproducible anywhere: its uniform number is a pure function of (seed, sequence,
// step) through Philox (core/philox.h), never of a generator's state, so the same seed gives the
// same tokens on any layout, whatever order the prompts are decoded in. Probabilities are formed
// in float64 from the fp32 logits.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace nf::generate {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy, the argmax (the lowest id among equal maxima)
  int64_t top_k = 0;         // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // keep the fewest most likely tokens whose mass reaches top_p
  uint64_t seed = 1;
};

// InvalidArgument naming the option when one is out of range (temperature < 0, top_k < 0, top_p
// outside (0, 1]).
absl::Status CheckSamplingOptions(const SamplingOptions& options);

// One candidate of the truncated distribution.
struct Candidate {
  int32_t id = 0;
  double probability = 0.0;  // renormalised over the kept candidates
};

// The tokens a draw chooses among, most likely first (ties: lower id first), with their
// probabilities after temperature, top-k, then top-p; logits: one row of the real vocabulary.
// Greedy keeps the argmax alone, with probability 1.
std::vector<Candidate> SamplingDistribution(std::span<const float> logits,
                                            const SamplingOptions& options);

// The uniform number in [0, 1) of step `step` of sequence `sequence` under `seed`.
double UniformDraw(uint64_t seed, uint64_t sequence, uint64_t step);

// The next token: the first candidate, in SamplingDistribution's order, at which the cumulative
// probability exceeds UniformDraw(options.seed, sequence, step).
int32_t SampleToken(std::span<const float> logits, const SamplingOptions& options,
                    uint64_t sequence, uint64_t step);

}  // namespace nf::generate
