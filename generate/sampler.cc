#include "generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/philox.h"

namespace nf::generate {

absl::Status CheckSamplingOptions(const SamplingOptions& options) {
  if (!(options.temperature >= 0.0) || !std::isfinite(options.temperature)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--temperature must be a finite number >= 0 (0: greedy), not ", options.temperature));
  }
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--top-k must be >= 0 (0: every token), not ", options.top_k));
  }
  if (!(options.top_p > 0.0 && options.top_p <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--top-p must lie in (0, 1] (1: no cut), not ", options.top_p));
  }
  return absl::OkStatus();
}

std::vector<Candidate> SamplingDistribution(std::span<const float> logits,
                                            const SamplingOptions& options) {
  std::vector<Candidate> candidates;
  if (logits.empty()) return candidates;
  if (options.temperature == 0.0) {
    const auto best = std::max_element(logits.begin(), logits.end());  // first of equal maxima
    candidates.push_back({.id = static_cast<int32_t>(best - logits.begin()), .probability = 1.0});
    return candidates;
  }
  const double max = *std::max_element(logits.begin(), logits.end());
  candidates.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    candidates.push_back({.id = static_cast<int32_t>(i),
                          .probability = std::exp((logits[i] - max) / options.temperature)});
  }
  std::stable_sort(
      candidates.begin(), candidates.end(),
      [](const Candidate& a, const Candidate& b) { return a.probability > b.probability; });
  if (options.top_k > 0 && static_cast<size_t>(options.top_k) < candidates.size()) {
    candidates.resize(options.top_k);
  }
  double total = 0.0;
  for (const Candidate& c : candidates) total += c.probability;
  if (options.top_p < 1.0) {
    // The smallest prefix whose mass reaches top_p of what top-k kept.
    double mass = 0.0;
    size_t keep = 0;
    while (keep < candidates.size() && mass < options.top_p * total) {
      mass += candidates[keep++].probability;
    }
    candidates.resize(std::max<size_t>(keep, 1));
    total = mass > 0.0 ? mass : candidates[0].probability;
  }
  for (Candidate& c : candidates) c.probability /= total;
  return candidates;
}

double UniformDraw(uint64_t seed, uint64_t sequence, uint64_t step) {
  const PhiloxCounter words =
      Philox4x32_10({static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32),
                     static_cast<uint32_t>(sequence), static_cast<uint32_t>(sequence >> 32)},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  // 53 random bits: every double of the form k / 2^53.
  const uint64_t bits = (static_cast<uint64_t>(words[0]) << 21) ^ (words[1] >> 11);
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}

int32_t SampleToken(std::span<const float> logits, const SamplingOptions& options,
                    uint64_t sequence, uint64_t step) {
  const std::vector<Candidate> candidates = SamplingDistribution(logits, options);
  if (candidates.size() == 1) return candidates[0].id;
  const double u = UniformDraw(options.seed, sequence, step);
  double cumulative = 0.0;
  for (const Candidate& c : candidates) {
    cumulative += c.probability;
    if (u < cumulative) return c.id;
  }
  return candidates.back().id;  // u within rounding of 1
}

}  // namespace nf::generate
