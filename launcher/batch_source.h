// Where a training step's tokens come from: the preprocessed datasets of data.path / data.blend
// (through data::BatchLoader: GPT samples of the training split, blended), or the synthetic
// Markov corpus when no dataset is configured. Either way the global batch of step s is a pure
// function of (seed, s, global batch size).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "launcher/train_config.pb.h"

namespace nf::launcher {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Fills inputs() and targets() with micro-batch `micro_batch` of step `step` (0-based) and
  // returns the global index of its first sample (dropout masks are keyed by it).
  virtual absl::StatusOr<int64_t> Load(int64_t step, int64_t micro_batch) = 0;
  virtual const Tensor& inputs() const = 0;   // i32 [micro_batch_size, seq_len]
  virtual const Tensor& targets() const = 0;  // i32 [micro_batch_size, seq_len]
  // "synthetic" or the dataset prefixes, for the start-up line.
  virtual std::string Describe() const = 0;
};

// OK when every dataset the config names has its PREFIX.bin and PREFIX.idx; otherwise
// NotFound naming the field (data.path or data.blend[k].path) and the missing file. Checked
// before a run starts, so that a typo fails at once rather than after start-up.
absl::Status CheckDataFilesExist(const TrainConfig& config);

enum class DataSplit {
  kTrain,       // the first share of data.split, train.train_iters global batches
  kValidation,  // the second share, train.eval_iters global batches, the same every evaluation
};

// The source `config.data` describes for `split`. The synthetic corpus has no documents to
// split: its validation samples are walks of the same chain far from any training sample.
absl::StatusOr<std::unique_ptr<BatchSource>> MakeBatchSource(const TrainConfig& config,
                                                             DataSplit split = DataSplit::kTrain);

}  // namespace nf::launcher
