// Data parallelism over the flat buffers of one model chunk (a ParamTable): the gradients are
// summed over the dp group in buckets, each started as soon as the backward of the step's last
// micro-batch has finished it, and AdamW runs either replicated on every dp rank (all-reduce)
// or sharded ZeRO-1 style (reduce-scatter; each rank keeps fp32 master weights and moments for
// 1/dp of every bucket, updates them, and all-gathers the parameters), which divides the
// optimizer's memory by dp.
//
// Buckets are contiguous ranges of the flat buffers carved from the top down, the order in
// which a backward finishes gradients (NormFormerModel::GradsDoneFrom): each holds
// bucket_elements elements rounded up to a multiple of dp, except the lowest, which holds the
// rest. The buffers' length must be a multiple of dp (ParamTable pads it) so that every bucket
// divides evenly. When sharded, rank d owns in each bucket [b, e) the slice
// [b + d (e - b) / dp, b + (d + 1) (e - b) / dp); its shard is those slices concatenated in
// buffer order.
//
// One step:
//   backward of the last micro-batch, reporting GradsDoneFrom(offset)   buckets start
//   [sum held gradients over the embedding group]
//   FinishGradReduction()                                               remaining buckets, wait
//   found = UnscaleAndCheck(scale)          [max over the world]
//   sq = SquaredGradNorm(counted ranges)    [sum over model parallel (and dp when sharded)]
//   overflow = UpdateWouldOverflow(lr, sqrt(sq))   [max over the world]
//   Update(lr, sqrt(sq))                    AdamW (+ all-gather when sharded)
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/optim/mixed_precision_optimizer.h"
#include "core/tensor.h"
#include "parallel/communicator.h"

namespace nf::parallel {

struct DataParallelOptions {
  int64_t bucket_elements = int64_t{1} << 22;  // > 0
  bool shard_optimizer = false;                // ZeRO-1
  // Buckets overlapping [0, hold_below) start only in FinishGradReduction: their gradients
  // are summed over the embedding group after the whole schedule has run.
  int64_t hold_below = 0;
};

// One bucket, and this rank's slice of it when sharded: full-buffer elements
// [slice_offset, slice_offset + slice_length) are shard elements [shard_offset, ...).
struct GradBucket {
  int64_t begin, end;
  int64_t slice_offset, slice_length, shard_offset;
};

// The buckets of a buffer of `numel` elements for rank `dp_rank` of `dp_size`, in buffer order.
// Refuses numel not a multiple of dp_size and bucket_elements < 1.
absl::StatusOr<std::vector<GradBucket>> MakeGradBuckets(int64_t numel, int64_t bucket_elements,
                                                        int dp_size, int dp_rank);

class DataParallelOptimizer {
 public:
  // params (model dtype) and grads (f32) are the chunk's flat buffers [n]; `ranges` what AdamW
  // updates (ParamTable::DecayRanges); dp must outlive the optimizer.
  static absl::StatusOr<std::unique_ptr<DataParallelOptimizer>> Create(
      Tensor params, Tensor grads, std::vector<optim::ParamRange> ranges,
      const optim::AdamWConfig& config, Communicator& dp, const DataParallelOptions& options);

  // Master weights from the model parameters (this rank's shard of them when sharded).
  absl::Status InitializeMasterFromModel();

  // The backward hook of the step's last micro-batch: starts every bucket lying at or above
  // `offset` that is not held and not started yet.
  absl::Status GradsDoneFrom(int64_t offset);
  // Starts the remaining buckets (in buffer order from the top) and waits for all: the full
  // gradients are then the dp sums (replicated), or this rank's shard is (sharded).
  absl::Status FinishGradReduction();
  // The reduced gradients of the full-buffer elements [offset, offset + length) that this rank
  // holds after FinishGradReduction, as views: the range itself (replicated), or its pieces in
  // this rank's shard (sharded). Ranks at the same dp index of different tensor-parallel ranks
  // get the same pieces (their flat layouts match): the sequence-parallel sum works on them.
  absl::StatusOr<std::vector<Tensor>> ReducedGrads(int64_t offset, int64_t length) const;

  // The optimizer stages of MixedPrecisionAdamW over this rank's reduced gradients: all of
  // them, or its shard.
  absl::StatusOr<bool> UnscaleAndCheck(float loss_scale);
  // Sum of squares of the reduced gradients in `counted` (full-buffer ranges, e.g. the model's
  // OwnedNormRanges) that this rank holds: all of them, or those in its shard. Summed over the
  // model-parallel group, plus the dp group when sharded, it is the global squared norm.
  absl::StatusOr<double> SquaredGradNorm(absl::Span<const optim::FlatRange> counted) const;
  // Whether Update(lr, grad_norm) would leave a parameter this rank updates (all of them, or
  // its shard) that the model dtype cannot hold (MixedPrecisionAdamW::UpdateWouldOverflow);
  // writes nothing. A max over the world of the flag gives every rank the same decision.
  absl::StatusOr<bool> UpdateWouldOverflow(float lr, double grad_norm);
  // Clip, AdamW, master -> parameters; when sharded, all-gathers the updated parameters.
  // Waits first for the state readers (AddStateReader).
  absl::Status Update(float lr, double grad_norm);

  // Something reading this rank's parameters, master weights and moments in the background (an
  // async checkpoint's snapshot copy, taken while the next step's forward and backward run):
  // the next Update, the only thing that writes them, waits until `done` is ready.
  void AddStateReader(std::shared_future<void> done) { state_readers_.push_back(std::move(done)); }
  // Seconds Update has waited for state readers, over the optimizer's life.
  double state_reader_wait_seconds() const { return state_reader_wait_seconds_; }

  bool sharded() const { return options_.shard_optimizer; }
  // Where this rank keeps optimizer state for the full-buffer elements [offset, offset +
  // length): calls fn(full_offset, state_offset, count) for each piece it holds, state_offset
  // indexing adamw()'s master and moment buffers (all of the range when replicated, the parts
  // in this rank's slices when sharded).
  absl::Status ForEachHeldPiece(
      int64_t offset, int64_t length,
      absl::FunctionRef<absl::Status(int64_t, int64_t, int64_t)> fn) const;
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  // The AdamW over this rank's part (the whole buffers, or the shard): checkpoints read it.
  optim::MixedPrecisionAdamW& adamw() { return *adamw_; }

 private:
  DataParallelOptimizer(Tensor params, Tensor grads, Communicator& dp, DataParallelOptions options,
                        std::vector<GradBucket> buckets)
      : params_(std::move(params)),
        grads_(std::move(grads)),
        dp_(&dp),
        options_(options),
        buckets_(std::move(buckets)) {}
  absl::Status Start(size_t bucket);
  // Calls fn(full_offset, shard_offset, length) for each piece of [offset, offset + length)
  // inside this rank's slices.
  template <typename Fn>
  absl::Status ForEachOwnedPiece(int64_t offset, int64_t length, Fn fn) const;

  Tensor params_, grads_;  // [n] full buffers
  Communicator* dp_;
  DataParallelOptions options_;
  std::vector<GradBucket> buckets_;
  std::vector<bool> started_;
  std::vector<std::unique_ptr<CommHandle>> pending_;
  // Sharded: this rank's [n / dp] parameters (model dtype) and reduced gradients (f32).
  Tensor shard_params_, shard_grads_;
  std::unique_ptr<optim::MixedPrecisionAdamW> adamw_;
  std::vector<std::shared_future<void>> state_readers_;
  double state_reader_wait_seconds_ = 0.0;
};

}  // namespace nf::parallel
