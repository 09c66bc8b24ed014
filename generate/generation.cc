#include "generate/generation.h"

#include "core/status.h"

namespace nf::generate {

absl::StatusOr<Generated> GenerateTokens(std::span<const int32_t> prompt,
                                         const GenerationOptions& options, uint64_t sequence,
                                         const NextLogits& next_logits) {
  if (prompt.empty()) return absl::InvalidArgumentError("GenerateTokens: an empty prompt");
  std::vector<float> logits;
  for (const int32_t token : prompt) {
    NF_ASSIGN_OR_RETURN(logits, next_logits(token));
  }
  Generated generated;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    const int32_t token = SampleToken(logits, options.sampling, sequence, step);
    if (options.end_of_document && token == *options.end_of_document) {
      generated.ended_document = true;
      break;
    }
    generated.ids.push_back(token);
    // The last token's logits would only be read by a step that does not come.
    if (step + 1 < options.max_new_tokens) {
      NF_ASSIGN_OR_RETURN(logits, next_logits(token));
    }
  }
  return generated;
}

}  // namespace nf::generate
