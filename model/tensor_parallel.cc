#include "model/tensor_parallel.h"

#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::model {

absl::StatusOr<Tensor> TensorParallelRegion::Enter(const Tensor& rows,
                                                   const Tensor& gathered) const {
  if (!sequence_parallel_) return rows;
  NF_RETURN_IF_ERROR(tp_->AllGather(rows, gathered));
  return gathered;
}

absl::Status TensorParallelRegion::Leave(const Tensor& partials, const Tensor& out) const {
  if (!sequence_parallel_) return tp_->AllReduce(out, parallel::ReduceOp::kSum);
  return tp_->ReduceScatter(partials, out);
}

absl::StatusOr<TensorParallelRegion::Pending> TensorParallelRegion::StartEnter(
    const Tensor& rows, const Tensor& gathered) const {
  if (!sequence_parallel_) return nullptr;
  return tp_->AllGatherAsync(rows, gathered);
}

absl::StatusOr<TensorParallelRegion::Pending> TensorParallelRegion::StartLeave(
    const Tensor& partials, const Tensor& out) const {
  if (!sequence_parallel_) return tp_->AllReduceAsync(out, parallel::ReduceOp::kSum);
  return tp_->ReduceScatterAsync(partials, out);
}

absl::Status ColumnParallelLinearForward(const TensorParallelRegion& region, const Tensor& x,
                                         const Param& weight, const Param& bias, const Tensor& y,
                                         const RegionBuffers& buffers) {
  NF_ASSIGN_OR_RETURN(const Tensor input, region.Enter(x, buffers.gathered));
  return LinearForward(input, weight, bias, y);
}

absl::Status ColumnParallelLinearBackward(const TensorParallelRegion& region, const Tensor& x,
                                          const Param& weight, const Param& bias, const Tensor& dy,
                                          const Tensor& dx, const RegionBuffers& buffers) {
  const Tensor& partials = region.PartialsFor(dx, buffers.partials);
  if (!region.overlap()) {
    NF_ASSIGN_OR_RETURN(const Tensor input, region.Enter(x, buffers.gathered));
    NF_RETURN_IF_ERROR(LinearBackward(input, weight, bias, dy, partials, /*accumulate_dx=*/false));
    return region.Leave(partials, dx);
  }
  // The input's gather runs while the input gradient [T, in] = dy W_local is computed, the input
  // gradient's reduction while the weight gradient dW += dy^T input is.
  NF_ASSIGN_OR_RETURN(TensorParallelRegion::Pending gather, region.StartEnter(x, buffers.gathered));
  const absl::Status input_grad = ops::Gemm({.a = dy, .b = weight.value, .c = partials});
  NF_RETURN_IF_ERROR(TensorParallelRegion::Wait(gather));
  NF_RETURN_IF_ERROR(input_grad);
  NF_ASSIGN_OR_RETURN(TensorParallelRegion::Pending reduce, region.StartLeave(partials, dx));
  const Tensor& input = region.sequence_parallel() ? buffers.gathered : x;
  absl::Status status =
      ops::Gemm({.a = dy, .b = input, .c = weight.grad, .trans_a = true, .beta = 1.0f});
  if (status.ok() && bias.defined()) status = ops::BiasBackward(dy, bias.grad);
  // Completed whatever happened: the buffers must not be reused while it runs.
  const absl::Status reduced = TensorParallelRegion::Wait(reduce);
  NF_RETURN_IF_ERROR(status);
  return reduced;
}

absl::Status RowParallelLinearForward(const TensorParallelRegion& region, const Tensor& x,
                                      const Param& weight, const Param& bias, const Tensor& y,
                                      const RegionBuffers& buffers) {
  const Tensor& partials = region.PartialsFor(y, buffers.partials);
  NF_RETURN_IF_ERROR(ops::Gemm({.a = x, .b = weight.value, .c = partials, .trans_b = true}));
  NF_RETURN_IF_ERROR(region.Leave(partials, y));
  return bias.defined() ? ops::AddBias(y, bias.value) : absl::OkStatus();
}

absl::Status RowParallelLinearBackward(const TensorParallelRegion& region, const Tensor& x,
                                       const Param& weight, const Param& bias, const Tensor& dy,
                                       const Tensor& dx, const RegionBuffers& buffers) {
  NF_ASSIGN_OR_RETURN(const Tensor output_grad, region.Enter(dy, buffers.gathered));
  NF_RETURN_IF_ERROR(
      LinearBackward(x, weight, /*bias=*/{}, output_grad, dx, /*accumulate_dx=*/false));
  return bias.defined() ? ops::BiasBackward(dy, bias.grad) : absl::OkStatus();
}

absl::Status ShardedLayerNormForward(const ops::LayerNormArgs& args, int64_t total_cols,
                                     const Tensor& stats, parallel::Communicator& tp) {
  if (tp.size() == 1) return ops::LayerNormForward(args);
  NF_RETURN_IF_ERROR(ops::LayerNormPartialStats(args.x, stats));
  NF_RETURN_IF_ERROR(tp.AllReduce(stats, parallel::ReduceOp::kSum));
  return ops::LayerNormForwardFromStats(args, stats, total_cols);
}

absl::Status ShardedLayerNormBackward(const ops::LayerNormBackwardArgs& args, int64_t total_cols,
                                      const Tensor& sums, parallel::Communicator& tp) {
  if (tp.size() == 1) return ops::LayerNormBackward(args);
  NF_RETURN_IF_ERROR(ops::LayerNormBackwardPartialSums(args, sums));
  NF_RETURN_IF_ERROR(tp.AllReduce(sums, parallel::ReduceOp::kSum));
  return ops::LayerNormBackwardFromSums(args, sums, total_cols);
}

}  // namespace nf::model
