// One sequence's generation, apart from where the logits come from: the prompt's tokens fed one
// by one, then each new token drawn (sampler.h) and fed back, until the end-of-document token or
// max_new_tokens. nf-generate and the training loop's samples feed it from a PipelineLm; the
// unit tests from fixed logits.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "generate/sampler.h"

namespace nf::generate {

struct GenerationOptions {
  int64_t max_new_tokens = 64;
  std::optional<int32_t> end_of_document;  // stops the sequence (and is not part of its text)
  SamplingOptions sampling;
};

// The logits [vocab] of the token after `token`, which the model appends to what it was fed.
using NextLogits = std::function<absl::StatusOr<std::vector<float>>(int32_t token)>;

struct Generated {
  std::vector<int32_t> ids;  // the new tokens, without the end-of-document token
  bool ended_document = false;
};

// Generates after `prompt` (at least one token: nf-generate starts every prompt with the
// end-of-document token, where documents start in training). `sequence` keys the draws.
absl::StatusOr<Generated> GenerateTokens(std::span<const int32_t> prompt,
                                         const GenerationOptions& options, uint64_t sequence,
                                         const NextLogits& next_logits);

}  // namespace nf::generate
