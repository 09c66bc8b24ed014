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

absl::Status ColumnParallelLinearForward(const TensorParallelRegion& region, const Tensor& x,
                                         const Param& weight, const Param& bias, const Tensor& y,
                                         const RegionBuffers& buffers) {
  NF_ASSIGN_OR_RETURN(const Tensor input, region.Enter(x, buffers.gathered));
  return LinearForward(input, weight, bias, y);
}

absl::Status ColumnParallelLinearBackward(const TensorParallelRegion& region, const Tensor& x,
                                          const Param& weight, const Param& bias, const Tensor& dy,
                                          const Tensor& dx, const RegionBuffers& buffers) {
  NF_ASSIGN_OR_RETURN(const Tensor input, region.Enter(x, buffers.gathered));
  const Tensor& partials = region.PartialsFor(dx, buffers.partials);
  NF_RETURN_IF_ERROR(LinearBackward(input, weight, bias, dy, partials, /*accumulate_dx=*/false));
  return region.Leave(partials, dx);
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
