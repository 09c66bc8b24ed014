// A language model spread over this rank's layout (its pipeline stage, sharded over its
// tensor-parallel group; eval::CreateStageModel) for one sequence at a time, that returns the
// full vocabulary's logits of the tokens it runs on every rank.
//
// Each call runs [1, seq_len] token ids down the pipeline with blocking sends and receives (the
// first stage embeds, stage r sends its [seq_len, d] output to r + 1), gathers the last stage's
// vocabulary slices over the tensor-parallel group ([seq_len, V_pad / tp] each) and broadcasts
// the rows of the real vocabulary from the last stage to the others: every rank then holds the
// same logits and makes the same sampling decision, with nothing else to agree on.
//
// Two ways to run: Cached (incremental decoding: seq_len new tokens after those already cached,
// NormFormerModel::ForwardCached) and Full (a whole sequence of seq_len tokens from position 0,
// what a cached step must equal).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"
#include "eval/eval_model.h"
#include "model/normformer_model.h"

namespace nf::generate {

class PipelineLm {
 public:
  static absl::StatusOr<std::unique_ptr<PipelineLm>> Create(const model::ModelConfig& config,
                                                            DType dtype, int64_t seq_len,
                                                            const eval::EvalRank& rank);

  absl::Status Load(const std::filesystem::path& dir, const checkpoint::Manifest& manifest);
  // The parameters of a PipelineLm of the same config and rank (seq_len may differ).
  absl::Status CopyParameters(const PipelineLm& from);
  // The parameters of a model of the same config, stage and tensor-parallel rank, by name (a
  // training model's table, whose flat buffers are padded for data parallelism).
  absl::Status CopyParameters(const model::ParamTable& from);

  int64_t seq_len() const { return seq_len_; }
  int64_t vocab_size() const { return model_->config().vocab_size(); }

  // Empties the KV cache, which holds up to `capacity` tokens (<= model.max_seq_len).
  absl::Status StartSequence(int64_t capacity);
  int64_t cached_tokens() const { return model_->cached_tokens(); }

  // ids: seq_len token ids, the same on every rank. Returns [seq_len, vocab_size] logits (row t:
  // the distribution of the token after ids[t]). Collective over the whole layout.
  absl::StatusOr<std::vector<float>> Cached(std::span<const int32_t> ids);
  absl::StatusOr<std::vector<float>> Full(std::span<const int32_t> ids);

 private:
  PipelineLm() = default;
  absl::StatusOr<std::vector<float>> Run(std::span<const int32_t> ids, bool cached);
  absl::StatusOr<std::vector<float>> GatherLogits();

  std::unique_ptr<model::NormFormerModel> model_;
  eval::EvalRank rank_;
  int64_t seq_len_ = 0;
  Tensor received_;  // [seq_len, d] on the device: the previous stage's output
};

}  // namespace nf::generate
