// The tensor-parallel building blocks of the layer (Megatron's conjugate operators), over the
// tensor-parallel group `tp` (a group of one makes every collective the identity):
//
//   column-parallel linear  W [out / tp, in]: forward local; backward sums the input grad
//   row-parallel linear     W [out, in / tp]: forward sums the partial outputs (then adds the
//                           replicated bias once); backward local
//   sharded LayerNorm       NormFormer's FFN LayerNorm over ffn_dim, which tp splits: per-row
//                           partial statistics all-reduced (f64 [T, 2] forward, f32 [T, 2]
//                           backward), so it normalises over the full dimension exactly
//
// Sequence parallelism (Megatron's, arXiv 2205.05198) splits the tokens instead of the
// features outside the column/row-parallel GEMMs: the LayerNorms, dropouts, residual adds and
// scales there hold this rank's [T / tp, d] rows (the micro-batch's tokens [rank T / tp,
// (rank + 1) T / tp)). The region's boundaries change collective, not volume per rank:
//
//                           entering (column-parallel input)    leaving (partial sums)
//   without                 identity: [T, d] everywhere         all-reduce [T, d]
//   sequence parallel       all-gather [T / tp, d] -> [T, d]    reduce-scatter [T, d] -> [T / tp,
//   d]
//
// and each replicated parameter's gradient is computed from this rank's rows only, so it is
// summed over tp once per step (NormFormerModel::SequenceParallelGradRanges).
//
// With `overlap`, a column-parallel backward computes the input gradient first and reduces it
// while it computes the weight gradient (and, with sequence parallelism, gathers the input
// while it computes the input gradient): the same operations on the same values, so the results
// are bit-identical, with the communication behind a GEMM where the transport progresses
// (NCCL's stream; MPI only inside its calls, so little of it on the CPU: docs/parallelism.md).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ops/ops.h"
#include "model/linear.h"
#include "parallel/communicator.h"

namespace nf::model {

// The boundaries of the tensor-parallel region, with or without sequence parallelism.
class TensorParallelRegion {
 public:
  // `tp` must outlive the region.
  TensorParallelRegion(parallel::Communicator* tp, bool sequence_parallel, bool overlap = false)
      : tp_(tp), sequence_parallel_(sequence_parallel), overlap_(overlap) {}

  bool sequence_parallel() const { return sequence_parallel_; }
  bool overlap() const { return overlap_; }
  parallel::Communicator& tp() const { return *tp_; }

  // What a column-parallel GEMM reads: `rows` [T, d] itself, or every rank's rows [T / tp, d]
  // gathered into `gathered` [T, d].
  absl::StatusOr<Tensor> Enter(const Tensor& rows, const Tensor& gathered) const;
  // Where the partial sums that Leave reduces into `out` are written: `out` itself (reduced in
  // place), or `partials` [T, d].
  const Tensor& PartialsFor(const Tensor& out, const Tensor& partials) const {
    return sequence_parallel_ ? partials : out;
  }
  // out = the sum over the group of each rank's `partials` (PartialsFor(out, ...)): all-reduced
  // in place [T, d], or reduce-scattered into this rank's rows `out` [T / tp, d].
  absl::Status Leave(const Tensor& partials, const Tensor& out) const;
  // Enter and Leave started, to be completed by Wait: null when there is nothing to wait for
  // (Enter without sequence parallelism). A group of one runs (and counts) its identity calls.
  using Pending = std::unique_ptr<parallel::CommHandle>;
  absl::StatusOr<Pending> StartEnter(const Tensor& rows, const Tensor& gathered) const;
  absl::StatusOr<Pending> StartLeave(const Tensor& partials, const Tensor& out) const;
  static absl::Status Wait(Pending& pending) {
    return pending ? pending->Wait() : absl::OkStatus();
  }

 private:
  parallel::Communicator* tp_;
  bool sequence_parallel_;
  bool overlap_;
};

// Buffers of the region's boundaries; both unused (may be undefined) without sequence
// parallelism, else [T, d] each.
struct RegionBuffers {
  Tensor gathered;  // an all-gathered input or output gradient
  Tensor partials;  // partial sums before their reduce-scatter
};

// y [T, out / tp] = Enter(x) W_local^T + b.
absl::Status ColumnParallelLinearForward(const TensorParallelRegion& region, const Tensor& x,
                                         const Param& weight, const Param& bias, const Tensor& y,
                                         const RegionBuffers& buffers);
// dW += dy^T Enter(x), db += column sums of dy; dx = the group's sum of dy W_local (x's rows).
absl::Status ColumnParallelLinearBackward(const TensorParallelRegion& region, const Tensor& x,
                                          const Param& weight, const Param& bias, const Tensor& dy,
                                          const Tensor& dx, const RegionBuffers& buffers);
// y = Leave(x_local [T, in / tp] W_local^T) + b: y holds the rows the region keeps.
absl::Status RowParallelLinearForward(const TensorParallelRegion& region, const Tensor& x,
                                      const Param& weight, const Param& bias, const Tensor& y,
                                      const RegionBuffers& buffers);
// dW += Enter(dy)^T x; dx [T, in / tp] = Enter(dy) W_local; db += column sums of dy (its rows:
// the bias was added after the reduction).
absl::Status RowParallelLinearBackward(const TensorParallelRegion& region, const Tensor& x,
                                       const Param& weight, const Param& bias, const Tensor& dy,
                                       const Tensor& dx, const RegionBuffers& buffers);

// LayerNorm over the last dimension split across `tp` (total_cols in all); `stats` is f64
// [T, 2] scratch, `sums` f32 [T, 2] scratch. With a group of one it is the plain LayerNorm.
absl::Status ShardedLayerNormForward(const ops::LayerNormArgs& args, int64_t total_cols,
                                     const Tensor& stats, parallel::Communicator& tp);
absl::Status ShardedLayerNormBackward(const ops::LayerNormBackwardArgs& args, int64_t total_cols,
                                      const Tensor& sums, parallel::Communicator& tp);

}  // namespace nf::model
