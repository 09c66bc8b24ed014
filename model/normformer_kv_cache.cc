// NormFormerModel's incremental decoding: a key/value cache per layer of the stage, so that each
// new token costs one token's forward instead of the whole prefix's (docs/design.md, nf-generate).
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "model/normformer_model.h"

namespace nf::model {
namespace {

// The in-flight key ForwardCached's activations use: it never runs beside a training forward.
constexpr int kCachedForwardKey = 0;

}  // namespace

absl::Status NormFormerModel::StartKvCache(int64_t capacity) {
  if (masked_lm()) {
    return absl::FailedPreconditionError(
        "incremental decoding generates causally, and this model is a masked LM "
        "(model.objective MASKED_LM: bidirectional attention); it does not generate text");
  }
  if (capacity < shape_.seq || capacity > config_.max_seq_len()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache capacity ", capacity, " must lie in [seq_len ", shape_.seq,
                     ", model.max_seq_len ", config_.max_seq_len(), "]"));
  }
  if (region_.sequence_parallel()) {
    return absl::FailedPreconditionError(
        "incremental decoding runs without sequence parallelism (a step holds too few tokens to "
        "split): create the model with ModelOptions::sequence_parallel false");
  }
  cached_tokens_ = 0;
  const Shape shape{shape_.batch, shape_.heads, capacity, shape_.head_dim};
  if (!kv_caches_.empty() && kv_caches_[0].k.dim(2) == capacity) {
    for (LayerKvCache& cache : kv_caches_) cache.past = 0;  // rows past `past` are never read
    return absl::OkStatus();
  }
  kv_caches_.clear();
  for (size_t l = 0; l < layers_.size(); ++l) {
    LayerKvCache& cache = kv_caches_.emplace_back();
    NF_ASSIGN_OR_RETURN(cache.k, Zeros(options_.dtype, shape));
    NF_ASSIGN_OR_RETURN(cache.v, Zeros(options_.dtype, shape));
  }
  return absl::OkStatus();
}

absl::StatusOr<const Tensor*> NormFormerModel::ForwardCached(const Tensor* input_ids,
                                                             const Tensor* input_hidden) {
  if (kv_caches_.size() != layers_.size()) {
    return absl::FailedPreconditionError("NormFormerModel::ForwardCached before StartKvCache");
  }
  const int64_t capacity = kv_caches_.empty() ? 0 : kv_caches_[0].k.dim(2);
  if (cached_tokens_ + shape_.seq > capacity) {
    return absl::OutOfRangeError(absl::StrCat("the KV cache holds ", capacity,
                                              " tokens: ", cached_tokens_, " cached + ", shape_.seq,
                                              " new do not fit"));
  }
  NF_RETURN_IF_ERROR(CheckStageInputs(input_ids, input_hidden, /*targets=*/nullptr));
  NF_ASSIGN_OR_RETURN(InFlight* const mb, Acquire(kCachedForwardKey));
  mb->step = {.first_sample = 0, .seed = options_.seed, .train = false};
  if (placement().first()) {
    NF_ASSIGN_OR_RETURN(const Tensor ids, input_ids->Reshape({shape_.tokens()}));
    NF_RETURN_IF_ERROR(ops::Copy(ids, mb->ids));
    NF_RETURN_IF_ERROR(EmbedForward(*mb, cached_tokens_));
  } else {
    NF_RETURN_IF_ERROR(ops::Copy(*input_hidden, mb->hidden[0]));
  }
  NF_RETURN_IF_ERROR(LayersForward(*mb, /*use_kv_cache=*/true));
  cached_tokens_ += shape_.seq;
  for (LayerKvCache& cache : kv_caches_) cache.past = cached_tokens_;
  if (!placement().last()) return &mb->hidden.back();
  last_forward_ = mb;
  NF_RETURN_IF_ERROR(LogitsForward(*mb));
  return nullptr;
}

}  // namespace nf::model
