// Training batches from the (blended) sample stream. The global batch of the step that starts at
// stream sample b is samples [b, b + G), G the global batch size, so with b = s G step s reads
// the same tokens whatever the data-parallel layout: data-parallel rank d of D takes samples
// [b + d G / D, b + (d + 1) G / D) of it, as G / (D m) micro-batches of m samples. A sample of
// L + 1 tokens gives one row of inputs (tokens [0, L)) and targets (tokens [1, L]).
//
// Training resumes from the consumed-sample count a checkpoint records, which need not be a
// multiple of G (the global batch size may change between runs). Tokens are checked against
// the model's vocabulary as they are read. After Create nothing is allocated per batch: the
// inputs, targets and one sample's scratch are owned here and refilled.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "data/blending.h"
#include "data/gpt_samples.h"

namespace nf::data {

struct BatchLoaderConfig {
  int64_t seq_len = 0;             // L
  int64_t global_batch_size = 0;   // G: samples per optimizer step over all data-parallel ranks
  int64_t micro_batch_size = 0;    // m: samples per forward/backward pass on one rank
  int64_t data_parallel_size = 1;  // D
  int64_t data_parallel_rank = 0;  // d
  int64_t vocab_size = 0;          // tokens must lie in [0, vocab_size)
};

class BatchLoader {
 public:
  // datasets[k] supplies the samples `blending` routes to dataset k: it must hold at least
  // blending.counts()[k] samples of config.seq_len tokens. InvalidArgument (one line) unless
  // G is a positive multiple of D m, 0 <= d < D, L >= 1, vocab_size >= 1 and the datasets fit.
  static absl::StatusOr<BatchLoader> Create(std::vector<GptSamples> datasets, Blending blending,
                                            const BatchLoaderConfig& config);

  const BatchLoaderConfig& config() const { return config_; }
  // G / (D m): micro-batches of this rank per global batch.
  int64_t micro_batches_per_step() const { return micro_batches_per_step_; }
  // Samples in the training stream.
  int64_t stream_size() const { return blending_.size(); }

  // Fills inputs() and targets() with micro-batch `micro_batch` (0 <= micro_batch <
  // micro_batches_per_step()) of this rank in the global batch starting at stream sample
  // `batch_start`, i.e. samples batch_start + d G / D + micro_batch m + [0, m). Returns the
  // stream index of its first sample (the model keys dropout by it). OutOfRange past the end of
  // the stream; InvalidArgument naming the dataset, document and token for a token outside the
  // vocabulary.
  absl::StatusOr<int64_t> Load(int64_t batch_start, int64_t micro_batch);

  // The next micro-batch of this rank: micro-batches 0, 1, ... of the global batch starting at
  // consumed_samples(), which advances by G after the last one. Errors as Load, leaving the
  // position unchanged.
  absl::StatusOr<int64_t> Next();
  // Samples (of all ranks) in the global batches Next has completed since the start or resume.
  int64_t consumed_samples() const { return consumed_samples_; }
  // Continues a run that consumed `consumed_samples` samples: the next global batch starts at
  // that stream sample.
  void ResumeFrom(int64_t consumed_samples);

  const Tensor& inputs() const { return inputs_; }    // i32 [m, L]
  const Tensor& targets() const { return targets_; }  // i32 [m, L]

 private:
  BatchLoader(std::vector<GptSamples> datasets, Blending blending, const BatchLoaderConfig& config,
              Tensor inputs, Tensor targets);
  // Reads stream sample `index` into sample_ and checks its tokens.
  absl::Status ReadSample(int64_t index);

  std::vector<GptSamples> datasets_;
  Blending blending_;
  BatchLoaderConfig config_;
  int64_t micro_batches_per_step_;
  Tensor inputs_, targets_;
  std::vector<int32_t> sample_;  // [L + 1]
  int64_t consumed_samples_ = 0;
  int64_t next_micro_batch_ = 0;
};

}  // namespace nf::data
