// Where a training step's tokens come from: the preprocessed datasets of data.path / data.blend
// (through data::BatchLoader: GPT samples of the training split, blended), or the synthetic
// Markov corpus when no dataset is configured. Either way a run reads one sample stream, a pure
// function of the data, the seed and the stream's size; a global batch is the G samples from
// the run's consumed-sample count on, so a run resumed with another global batch size continues
// the same stream (checkpoints record the count and the stream's size).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "launcher/train_config.pb.h"

namespace nf::launcher {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Fills inputs() and targets() with micro-batch `micro_batch` of the global batch that starts
  // at stream sample `batch_start`, and returns the stream index of its first sample,
  // batch_start + micro_batch x micro_batch_size (dropout masks are keyed by it).
  virtual absl::StatusOr<int64_t> Load(int64_t batch_start, int64_t micro_batch) = 0;
  // Samples in the stream (the synthetic corpus: unbounded, INT64_MAX).
  virtual int64_t stream_size() const = 0;
  // The tokens that carry a loss in stream samples [first, first + samples): what a step's mean
  // loss divides by, known before its forwards. Every position of a causal LM's samples; a masked
  // LM's chosen positions, counted from the stream alone (the same on every rank, no
  // communication).
  virtual int64_t LossTokens(int64_t /*first*/, int64_t samples) const {
    return samples * inputs().dim(1);
  }
  virtual const Tensor& inputs() const = 0;   // i32 [micro_batch_size, seq_len]
  virtual const Tensor& targets() const = 0;  // i32 [micro_batch_size, seq_len]
  // "synthetic" or the dataset prefixes, for the start-up line.
  virtual std::string Describe() const = 0;
  // The epochs each dataset's samples span, in data.path, data.blend order (empty for the
  // synthetic corpus). Two streams of one config that differ only in size agree on their
  // common prefix exactly when these agree: blending is prefix-stable, and a dataset's sample
  // order depends on its size only through its epoch count (data/gpt_samples.h).
  virtual std::vector<int64_t> StreamEpochs() const = 0;
};

// OK when every dataset the config names has its PREFIX.bin and PREFIX.idx; otherwise
// NotFound naming the field (data.path or data.blend[k].path) and the missing file. Checked
// before a run starts, so that a typo fails at once rather than after start-up.
absl::Status CheckDataFilesExist(const TrainConfig& config);

enum class DataSplit {
  kTrain,       // the first share of data.split, train.train_iters global batches
  kValidation,  // the second share, train.eval_iters global batches, the same every evaluation
};

// Samples a split's stream holds by default: train.train_iters (or train.eval_iters) global
// batches.
int64_t DefaultStreamSize(const TrainConfig& config, DataSplit split);

// The source `config.data` describes for `split`, a stream of `stream_size` samples (0: the
// default). The synthetic corpus has no documents to split and no end: its validation samples
// are walks of the same chain far from any training sample. For a masked LM
// (model.objective MASKED_LM) each row is a sample's first seq_len tokens corrupted as
// data.masked_lm says (data/masked_lm.h), keyed by (train.seed, stream index), and the targets
// are the originals at the chosen positions, -1 elsewhere.
absl::StatusOr<std::unique_ptr<BatchSource>> MakeBatchSource(const TrainConfig& config,
                                                             DataSplit split = DataSplit::kTrain,
                                                             int64_t stream_size = 0);

}  // namespace nf::launcher
