#include "data/synthetic_corpus.h"

#include "absl/strings/str_cat.h"
#include "core/philox.h"

namespace nf::data {
namespace {

// Philox streams of the corpus: the successor table, and per-sample draws.
constexpr uint32_t kTableStream = 0x7AB1E;
constexpr uint32_t kSampleStream = 0x5A3B1E;

uint32_t Word(uint32_t seed, uint32_t stream, uint64_t a, uint64_t b) {
  return Philox4x32_10({static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32),
                        static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32)},
                       {seed, stream})[0];
}

}  // namespace

absl::StatusOr<SyntheticCorpus> SyntheticCorpus::Create(int64_t vocab_size, int branching,
                                                        uint32_t seed) {
  if (branching < 1 || branching > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("data.synthetic.branching (", branching,
                                                   ") must be in [1, vocab_size = ", vocab_size,
                                                   "]"));
  }
  return SyntheticCorpus(vocab_size, branching, seed);
}

SyntheticCorpus::SyntheticCorpus(int64_t vocab_size, int branching, uint32_t seed)
    : vocab_size_(vocab_size), branching_(branching), seed_(seed) {
  successors_.resize(vocab_size * branching);
  // A token's successors must be distinct, or it would have fewer than `branching` of them and
  // the best loss would fall below ln(branching): draw 0, 1, 2, ... and keep the first
  // `branching` distinct values (a token whose first draws do not collide keeps exactly them).
  std::vector<bool> taken(vocab_size, false);
  for (int64_t token = 0; token < vocab_size; ++token) {
    int32_t* row = &successors_[token * branching];
    uint64_t draw = 0;
    for (int b = 0; b < branching;) {
      const auto next = static_cast<int32_t>(Word(seed, kTableStream, token, draw++) % vocab_size);
      if (taken[next]) continue;
      taken[next] = true;
      row[b++] = next;
    }
    for (int b = 0; b < branching; ++b) taken[row[b]] = false;
  }
}

void SyntheticCorpus::Sample(uint64_t index, int64_t length, int32_t* out) const {
  if (length <= 0) return;
  out[0] = static_cast<int32_t>(Word(seed_, kSampleStream, index, 0) % vocab_size_);
  for (int64_t i = 1; i < length; ++i) {
    const uint32_t choice = Word(seed_, kSampleStream, index, i) % branching_;
    out[i] = successors_[out[i - 1] * branching_ + choice];
  }
}

}  // namespace nf::data
