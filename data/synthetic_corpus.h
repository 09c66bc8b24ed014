// A synthetic token stream with learnable structure, used to train before real corpora exist
// and by tests: a Markov chain over the vocabulary in which each token has `branching`
// distinct possible successors, drawn once from the seed, each followed with equal probability.
// The best achievable loss is ln(branching) per token (from the second token of a sample on).
//
// Samples are a pure function of (seed, global sample index), so any data-parallel layout
// and any resumption point see the same tokens, like the real sampler's promise.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace nf::data {

class SyntheticCorpus {
 public:
  // InvalidArgument unless 1 <= branching <= vocab_size.
  static absl::StatusOr<SyntheticCorpus> Create(int64_t vocab_size, int branching, uint32_t seed);

  // Writes `length` tokens of sample `index` into out[0, length).
  void Sample(uint64_t index, int64_t length, int32_t* out) const;

  int64_t vocab_size() const { return vocab_size_; }
  int branching() const { return branching_; }

 private:
  SyntheticCorpus(int64_t vocab_size, int branching, uint32_t seed);

  int64_t vocab_size_;
  int branching_;
  uint32_t seed_;
  std::vector<int32_t> successors_;  // [vocab_size, branching]
};

}  // namespace nf::data
