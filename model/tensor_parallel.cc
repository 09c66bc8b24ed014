#include "model/tensor_parallel.h"

#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::model {

absl::Status RowParallelLinearForward(const Tensor& x, const Param& weight, const Param& bias,
                                      const Tensor& y, parallel::Communicator& tp) {
  NF_RETURN_IF_ERROR(ops::Gemm({.a = x, .b = weight.value, .c = y, .trans_b = true}));
  NF_RETURN_IF_ERROR(tp.AllReduce(y, parallel::ReduceOp::kSum));
  return bias.defined() ? ops::AddBias(y, bias.value) : absl::OkStatus();
}

absl::Status ReduceInputGrad(const Tensor& dx, parallel::Communicator& tp) {
  return tp.AllReduce(dx, parallel::ReduceOp::kSum);
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
