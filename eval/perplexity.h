// Perplexity on a part of a preprocessed dataset (a split of its documents, as data.split
// defines them for training, or all of it): the part's tokens back to back in document order
// (end-of-document tokens as nf-preprocess stored them) cut into non-overlapping windows of
// seq_len predictions. Window k reads tokens [k S, k S + S]: the first S are the inputs, each
// predicting the next, so every token after the part's first is predicted exactly once, with the
// window's tokens before it as context (as Megatron's GPT samples read a corpus; the last window
// is shorter). The loss is the mean negative log-likelihood over those tokens (the model's own
// fp32 cross-entropy, summed in float64), and the perplexity exp(loss).
//
// A masked LM's perplexity (EvaluateMaskedPerplexity) reads window k as tokens [k S, k S + S),
// corrupted as training corrupts a sample (data::MaskSample keyed by (seed, k)), and predicts
// the chosen tokens from the whole corrupted window: the loss is the mean cross-entropy over the
// chosen tokens of every window (targets -1 elsewhere), the perplexity exp(loss). Only whole
// windows count: the part's last tokens, fewer than S, are skipped, since an encoder would
// attend any padding that filled the window out (the model has no padding mask), and a shorter
// window would be a shape training never saw. Keys by window index make the masks the same on
// every layout and micro-batch size.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/document_source.h"
#include "data/indexed_dataset.h"
#include "data/masked_lm.h"
#include "eval/eval_model.h"

namespace nf::eval {

// The tokens of documents `range` of a dataset as one stream.
class DocumentTokens {
 public:
  static absl::StatusOr<DocumentTokens> Open(const std::string& prefix, data::DocumentRange range);

  int64_t size() const { return starts_.back(); }
  // Tokens [offset, offset + count) of the stream into out (within size()).
  void Read(int64_t offset, int64_t count, int32_t* out) const;

 private:
  std::shared_ptr<data::IndexedDataset> dataset_;
  std::vector<int64_t> sequences_;  // the dataset's sequences in the range, in order
  std::vector<int64_t> starts_;     // stream offset of each, then the total
};

struct PerplexityResult {
  int64_t windows = 0;
  int64_t tokens = 0;  // predicted tokens: a masked LM's chosen (masked) tokens
  double loss = 0.0;   // mean negative log-likelihood (nats)
  double ppl = 0.0;
  std::optional<uint32_t> mask_seed;  // a masked LM's: the seed of its windows' masks
};

// The first `max_windows` windows (0: all) of model.seq_len() predictions, EvalModel::rows() a
// micro-batch, micro-batches shared by the data-parallel replicas. Collective over the world.
absl::StatusOr<PerplexityResult> EvaluatePerplexity(EvalModel& model,
                                                    const parallel::ProcessGroups& groups,
                                                    const DocumentTokens& tokens,
                                                    int64_t max_windows);

// A masked LM's: the first `max_windows` (0: all) of the part's whole windows of model.seq_len()
// tokens, window k masked by data::MaskSample(spec, k, ...), spec.seed the mask seed. Refuses a
// part shorter than one window. Collective over the world.
absl::StatusOr<PerplexityResult> EvaluateMaskedPerplexity(EvalModel& model,
                                                          const parallel::ProcessGroups& groups,
                                                          const DocumentTokens& tokens,
                                                          const data::MaskedLmSpec& spec,
                                                          int64_t max_windows);

}  // namespace nf::eval
