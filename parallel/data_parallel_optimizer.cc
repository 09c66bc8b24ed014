#include "parallel/data_parallel_optimizer.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/ops/backend.h"
#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::parallel {

absl::StatusOr<std::vector<GradBucket>> MakeGradBuckets(int64_t numel, int64_t bucket_elements,
                                                        int dp_size, int dp_rank) {
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size || bucket_elements < 1 || numel < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient buckets need bucket_elements >= 1 and 0 <= dp rank < dp size (got ",
                     bucket_elements, ", rank ", dp_rank, " of ", dp_size, ")"));
  }
  if (numel % dp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gradient buffer of ", numel,
                                                   " elements does not divide by data_parallel ",
                                                   dp_size, ": pad it to a multiple"));
  }
  const int64_t size = (bucket_elements + dp_size - 1) / dp_size * dp_size;
  std::vector<GradBucket> buckets;
  for (int64_t end = numel; end > 0; end -= size) {
    const int64_t begin = std::max<int64_t>(0, end - size);
    const int64_t slice = (end - begin) / dp_size;
    buckets.push_back({.begin = begin,
                       .end = end,
                       .slice_offset = begin + dp_rank * slice,
                       .slice_length = slice,
                       .shard_offset = 0});
  }
  std::reverse(buckets.begin(), buckets.end());
  int64_t shard = 0;
  for (GradBucket& b : buckets) {
    b.shard_offset = shard;
    shard += b.slice_length;
  }
  return buckets;
}

absl::StatusOr<std::unique_ptr<DataParallelOptimizer>> DataParallelOptimizer::Create(
    Tensor params, Tensor grads, std::vector<optim::ParamRange> ranges,
    const optim::AdamWConfig& config, Communicator& dp, const DataParallelOptions& options) {
  NF_ASSIGN_OR_RETURN(
      std::vector<GradBucket> buckets,
      MakeGradBuckets(grads.numel(), options.bucket_elements, dp.size(), dp.rank()));
  std::unique_ptr<DataParallelOptimizer> opt(
      new DataParallelOptimizer(params, grads, dp, options, std::move(buckets)));
  // Optimizer state lives with the parameters.
  NF_ASSIGN_OR_RETURN(Allocator * allocator, ops::AllocatorFor(params.device()));
  opt->started_.assign(opt->buckets_.size(), false);
  if (!options.shard_optimizer) {
    NF_ASSIGN_OR_RETURN(
        optim::MixedPrecisionAdamW adamw,
        optim::MixedPrecisionAdamW::Create(params, grads, std::move(ranges), config, *allocator));
    opt->adamw_ = std::make_unique<optim::MixedPrecisionAdamW>(std::move(adamw));
    return opt;
  }
  const int64_t shard = grads.numel() / dp.size();
  NF_ASSIGN_OR_RETURN(opt->shard_params_, ops::Zeros(params.dtype(), {shard}, params.device()));
  NF_ASSIGN_OR_RETURN(opt->shard_grads_, ops::Zeros(DType::kF32, {shard}, params.device()));
  // The AdamW ranges, cut to this rank's slices and renumbered into the shard.
  std::vector<optim::ParamRange> shard_ranges;
  for (const optim::ParamRange& r : ranges) {
    NF_RETURN_IF_ERROR(opt->ForEachOwnedPiece(
        r.offset, r.length, [&](int64_t, int64_t shard_offset, int64_t length) {
          shard_ranges.push_back(
              {.offset = shard_offset, .length = length, .weight_decay = r.weight_decay});
          return absl::OkStatus();
        }));
  }
  NF_ASSIGN_OR_RETURN(
      optim::MixedPrecisionAdamW adamw,
      optim::MixedPrecisionAdamW::Create(opt->shard_params_, opt->shard_grads_,
                                         std::move(shard_ranges), config, *allocator));
  opt->adamw_ = std::make_unique<optim::MixedPrecisionAdamW>(std::move(adamw));
  return opt;
}

template <typename Fn>
absl::Status DataParallelOptimizer::ForEachOwnedPiece(int64_t offset, int64_t length, Fn fn) const {
  for (const GradBucket& b : buckets_) {
    const int64_t begin = std::max(offset, b.slice_offset);
    const int64_t end = std::min(offset + length, b.slice_offset + b.slice_length);
    if (begin >= end) continue;
    NF_RETURN_IF_ERROR(fn(begin, b.shard_offset + (begin - b.slice_offset), end - begin));
  }
  return absl::OkStatus();
}

absl::Status DataParallelOptimizer::ForEachHeldPiece(
    int64_t offset, int64_t length,
    absl::FunctionRef<absl::Status(int64_t, int64_t, int64_t)> fn) const {
  if (!sharded()) return length > 0 ? fn(offset, offset, length) : absl::OkStatus();
  return ForEachOwnedPiece(offset, length, fn);
}

absl::Status DataParallelOptimizer::InitializeMasterFromModel() {
  if (sharded()) {
    for (const GradBucket& b : buckets_) {
      NF_ASSIGN_OR_RETURN(const Tensor full, params_.Slice(b.slice_offset, b.slice_length));
      NF_ASSIGN_OR_RETURN(const Tensor part, shard_params_.Slice(b.shard_offset, b.slice_length));
      NF_RETURN_IF_ERROR(ops::Cast(full, part));
    }
  }
  return adamw_->InitializeMasterFromModel();
}

absl::Status DataParallelOptimizer::Start(size_t index) {
  const GradBucket& b = buckets_[index];
  started_[index] = true;
  NF_ASSIGN_OR_RETURN(const Tensor bucket, grads_.Slice(b.begin, b.end - b.begin));
  std::unique_ptr<CommHandle> handle;
  if (sharded()) {
    NF_ASSIGN_OR_RETURN(const Tensor slice, shard_grads_.Slice(b.shard_offset, b.slice_length));
    NF_ASSIGN_OR_RETURN(handle, dp_->ReduceScatterAsync(bucket, slice));
  } else {
    NF_ASSIGN_OR_RETURN(handle, dp_->AllReduceAsync(bucket, ReduceOp::kSum));
  }
  pending_.push_back(std::move(handle));
  return absl::OkStatus();
}

absl::Status DataParallelOptimizer::GradsDoneFrom(int64_t offset) {
  for (size_t i = buckets_.size(); i-- > 0;) {
    const GradBucket& b = buckets_[i];
    if (b.begin < offset) break;
    if (started_[i] || b.begin < options_.hold_below) continue;
    NF_RETURN_IF_ERROR(Start(i));
  }
  return absl::OkStatus();
}

absl::Status DataParallelOptimizer::FinishGradReduction() {
  for (size_t i = buckets_.size(); i-- > 0;) {
    if (!started_[i]) NF_RETURN_IF_ERROR(Start(i));
  }
  absl::Status status;
  for (std::unique_ptr<CommHandle>& handle : pending_) status.Update(handle->Wait());
  pending_.clear();
  started_.assign(buckets_.size(), false);
  return status;
}

absl::StatusOr<std::vector<Tensor>> DataParallelOptimizer::ReducedGrads(int64_t offset,
                                                                        int64_t length) const {
  std::vector<Tensor> pieces;
  NF_RETURN_IF_ERROR(ForEachHeldPiece(
      offset, length, [&](int64_t full_offset, int64_t state_offset, int64_t count) {
        NF_ASSIGN_OR_RETURN(Tensor piece, sharded() ? shard_grads_.Slice(state_offset, count)
                                                    : grads_.Slice(full_offset, count));
        pieces.push_back(std::move(piece));
        return absl::OkStatus();
      }));
  return pieces;
}

absl::StatusOr<bool> DataParallelOptimizer::UnscaleAndCheck(float loss_scale) {
  return adamw_->UnscaleAndCheck(loss_scale);
}

absl::StatusOr<double> DataParallelOptimizer::SquaredGradNorm(
    absl::Span<const optim::FlatRange> counted) const {
  NF_ASSIGN_OR_RETURN(const Tensor sum, ops::Zeros(DType::kF32, {1}, grads_.device()));
  for (const optim::FlatRange& r : counted) {
    if (!sharded()) {
      NF_ASSIGN_OR_RETURN(const Tensor part, grads_.Slice(r.offset, r.length));
      NF_RETURN_IF_ERROR(ops::SquaredNorm(part, sum));
      continue;
    }
    NF_RETURN_IF_ERROR(
        ForEachOwnedPiece(r.offset, r.length, [&](int64_t, int64_t shard_offset, int64_t length) {
          NF_ASSIGN_OR_RETURN(const Tensor part, shard_grads_.Slice(shard_offset, length));
          return ops::SquaredNorm(part, sum);
        }));
  }
  NF_ASSIGN_OR_RETURN(const Tensor host, ops::OnHost(sum));
  return static_cast<double>(host.data<float>()[0]);
}

absl::StatusOr<bool> DataParallelOptimizer::UpdateWouldOverflow(float lr, double grad_norm) {
  return adamw_->UpdateWouldOverflow(lr, grad_norm);
}

absl::Status DataParallelOptimizer::Update(float lr, double grad_norm) {
  if (!state_readers_.empty()) {
    const auto start = std::chrono::steady_clock::now();
    for (const std::shared_future<void>& reader : state_readers_) reader.wait();
    state_readers_.clear();
    state_reader_wait_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  NF_RETURN_IF_ERROR(adamw_->Update(lr, grad_norm));
  if (!sharded()) return absl::OkStatus();
  std::vector<std::unique_ptr<CommHandle>> gathers;
  for (const GradBucket& b : buckets_) {
    NF_ASSIGN_OR_RETURN(const Tensor part, shard_params_.Slice(b.shard_offset, b.slice_length));
    NF_ASSIGN_OR_RETURN(const Tensor bucket, params_.Slice(b.begin, b.end - b.begin));
    NF_ASSIGN_OR_RETURN(std::unique_ptr<CommHandle> handle, dp_->AllGatherAsync(part, bucket));
    gathers.push_back(std::move(handle));
  }
  absl::Status status;
  for (std::unique_ptr<CommHandle>& handle : gathers) status.Update(handle->Wait());
  return status;
}

}  // namespace nf::parallel
