// The tensor-parallel building blocks of the layer (Megatron's conjugate operators), over the
// tensor-parallel group `tp` (a group of one makes every collective the identity):
//
//   column-parallel linear  W [out / tp, in]: forward local; backward all-reduces the input grad
//   row-parallel linear     W [out, in / tp]: forward all-reduces the output (then adds the
//                           replicated bias once); backward local
//   sharded LayerNorm       NormFormer's FFN LayerNorm over ffn_dim, which tp splits: per-row
//                           partial statistics all-reduced (f64 [T, 2] forward, f32 [T, 2]
//                           backward), so it normalises over the full dimension exactly
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/ops.h"
#include "model/linear.h"
#include "parallel/communicator.h"

namespace nf::model {

// y [T, out] = all-reduce(x_local [T, in / tp] W_local^T) + b.
absl::Status RowParallelLinearForward(const Tensor& x, const Param& weight, const Param& bias,
                                      const Tensor& y, parallel::Communicator& tp);

// The input gradient of column-parallel layers: each rank holds the part its columns
// contribute; the sum over the group is the full gradient, identical on every rank.
absl::Status ReduceInputGrad(const Tensor& dx, parallel::Communicator& tp);

// LayerNorm over the last dimension split across `tp` (total_cols in all); `stats` is f64
// [T, 2] scratch, `sums` f32 [T, 2] scratch. With a group of one it is the plain LayerNorm.
absl::Status ShardedLayerNormForward(const ops::LayerNormArgs& args, int64_t total_cols,
                                     const Tensor& stats, parallel::Communicator& tp);
absl::Status ShardedLayerNormBackward(const ops::LayerNormBackwardArgs& args, int64_t total_cols,
                                      const Tensor& sums, parallel::Communicator& tp);

}  // namespace nf::model
