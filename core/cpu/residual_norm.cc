// The residual add between a layer's attention and feed-forward blocks, fused on the CPU with the
// LayerNorms on either side of it: NormFormer's post-attention LayerNorm on the branch (when
// there) and the feed-forward block's input LayerNorm on the sum. The rows are taken a block at
// a time (the backward's 64-row parameter-gradient blocks, the forward's chunks of 16), each
// stage run over the whole block with the row kernels the unfused ops run (isa/norm_kernels.h,
// the dropout and axpy kernels), its intermediate in a per-thread buffer that stays in cache; so
// the results are the unfused composition's bit for bit. Other dtypes run that composition.
//
// Unfused, NormFormer makes six passes over [rows, cols] here (LayerNorm, dropout, cast, axpy,
// LayerNorm, each reading what the last wrote) and its backward four; fused, the forward reads
// x and branch and writes residual and y, the backward reads dy, residual, branch and
// d_residual and writes d_residual and d_branch. Stage by stage rather than row by row, because
// at the 125M shape a row-by-row loop kept six row streams in flight and ran slower than the
// unfused ops (nf-bench-ops residual_norm_*: 1.44-1.51 against 1.24-1.39 ms forward on
// [2048, 768]); a stage touches at most three.
#include <algorithm>

#include "core/cpu/activation_rows.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/isa/norm_kernels.h"
#include "core/cpu/kernel_util.h"
#include "core/cpu/layer_norm_blocks.h"
#include "core/ops/composed_ops.h"

namespace nf::cpu {
namespace {

// Rows per forward chunk: [16, cols] floats of intermediate, 48 KiB at d_model 768.
constexpr int64_t kForwardChunkRows = 16;

bool AllF32(std::initializer_list<Tensor> tensors) {
  return std::all_of(tensors.begin(), tensors.end(),
                     [](const Tensor& t) { return t.dtype() == DType::kF32; });
}

bool UsesF32Kernels(const ops::ResidualNormArgs& args) {
  return AllF32({args.x, args.branch, args.weight}) &&
         (!args.norms_branch() || args.branch_weight.dtype() == DType::kF32);
}

bool UsesF32Kernels(const ops::ResidualNormBackwardArgs& args) {
  return AllF32({args.residual, args.weight}) &&
         (!args.norms_branch() || args.branch_weight.dtype() == DType::kF32);
}

// One row of a LayerNorm backward from x, dy [cols] and the row's statistics: dx [cols] and the
// row's parameter-gradient terms added to sum_w, sum_b (LayerNormBackward's row, bit for bit).
void LayerNormBackwardRow(const NormKernels& norm, const float* x, const float* dy, const float* w,
                          float mean, float rstd, int64_t cols, float* dx, float* sum_w,
                          float* sum_b) {
  double sums[2];  // sum g, sum g * xhat over the row (g = dy * w)
  norm.backward_row_sums(x, dy, w, mean, rstd, cols, sums);
  norm.input_and_param_grad_row(x, dy, w, mean, rstd, static_cast<float>(sums[0] / cols),
                                static_cast<float>(sums[1] / cols), cols, dx, sum_w, sum_b);
}

}  // namespace

absl::Status CpuBackend::ResidualNormForward(const ops::ResidualNormArgs& args) {
  if (!UsesF32Kernels(args)) return ops::ComposedResidualNormForward(*this, args);
  const NormKernels& norm = Norm();
  const ElementwiseKernels& elementwise = Elementwise();
  const int64_t cols = ops::Cols(args.residual), rows = ops::Rows(args.residual);
  const bool dropout = args.dropout.p > 0.0f;
  const float* x = args.x.data<float>();
  const float* branch = args.branch.data<float>();
  float* residual = args.residual.data<float>();
  float* y = args.y.data<float>();
  const int64_t chunks = (rows + kForwardChunkRows - 1) / kForwardChunkRows;
  const int64_t work = kForwardChunkRows * cols * ((args.norms_branch() ? 12 : 6) + 6);
  ParallelFor(chunks, work, [&](int64_t first_chunk, int64_t end_chunk) {
    // [kForwardChunkRows, cols]: the chunk's dropout(LayerNorm_branch(branch)).
    float* z = RowBuffers(kForwardChunkRows, cols);
    for (int64_t chunk = first_chunk; chunk < end_chunk; ++chunk) {
      const int64_t begin = chunk * kForwardChunkRows;
      const int64_t count = std::min(rows, begin + kForwardChunkRows) - begin;
      const int64_t at = begin * cols;
      const float* added = branch + at;
      if (args.norms_branch()) {
        norm.forward(added, args.branch_weight.data<float>(), args.branch_bias.data<float>(), count,
                     cols, args.eps, z, args.branch_mean.data<float>() + begin,
                     args.branch_rstd.data<float>() + begin);
        added = z;
      }
      if (dropout) {
        for (int64_t i = 0; i < count; ++i) {
          elementwise.dropout_row(DropoutRowOf(args.dropout, begin + i), added + i * cols,
                                  z + i * cols, cols);
        }
        added = z;
      }
      std::copy_n(x + at, count * cols, residual + at);
      elementwise.axpy(1.0f, added, residual + at, count * cols);
      norm.forward(residual + at, args.weight.data<float>(), args.bias.data<float>(), count, cols,
                   args.eps, y + at, args.mean.data<float>() + begin,
                   args.rstd.data<float>() + begin);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::ResidualNormBackward(const ops::ResidualNormBackwardArgs& args) {
  if (!UsesF32Kernels(args)) return ops::ComposedResidualNormBackward(*this, args);
  const NormKernels& norm = Norm();
  const ElementwiseKernels& elementwise = Elementwise();
  const int64_t cols = ops::Cols(args.residual), rows = ops::Rows(args.residual);
  const bool dropout = args.dropout.p > 0.0f;
  const float* dy = args.dy.data<float>();
  const float* residual = args.residual.data<float>();
  const float* branch = args.branch.data<float>();
  float* d_residual = args.d_residual.data<float>();
  float* d_branch = args.d_branch.data<float>();
  const auto block_body = [&](int64_t begin, int64_t end, float* sums) {
    // [64, cols]: the LayerNorm's input gradient, then the branch's dropped-out gradient.
    float* buffer = RowBuffers(kLayerNormRowsPerBlock, cols);
    const int64_t at = begin * cols, count = end - begin;
    for (int64_t r = begin; r < end; ++r) {
      LayerNormBackwardRow(norm, residual + r * cols, dy + r * cols, args.weight.data<float>(),
                           args.mean.data<float>()[r], args.rstd.data<float>()[r], cols,
                           buffer + (r - begin) * cols, sums, sums + cols);
    }
    elementwise.axpy(1.0f, buffer, d_residual + at, count * cols);
    // The branch's gradient is dropout(d_residual): into d_branch without the branch
    // LayerNorm, else into the buffer for that LayerNorm's backward.
    float* dz = args.norms_branch() ? buffer : d_branch + at;
    for (int64_t r = begin; r < end; ++r) {
      if (dropout) {
        elementwise.dropout_row(DropoutRowOf(args.dropout, r), d_residual + r * cols,
                                dz + (r - begin) * cols, cols);
      } else {
        std::copy_n(d_residual + r * cols, cols, dz + (r - begin) * cols);
      }
    }
    if (!args.norms_branch()) return;
    for (int64_t r = begin; r < end; ++r) {
      LayerNormBackwardRow(norm, branch + r * cols, dz + (r - begin) * cols,
                           args.branch_weight.data<float>(), args.branch_mean.data<float>()[r],
                           args.branch_rstd.data<float>()[r], cols, d_branch + r * cols,
                           sums + 2 * cols, sums + 3 * cols);
    }
  };
  const int64_t work = cols * ((args.norms_branch() ? 24 : 12) + (dropout ? 4 : 0) + 2);
  if (args.norms_branch()) {
    ForEachBlockWithColumnGrads<float>(
        rows, cols, work, {args.dweight, args.dbias, args.d_branch_weight, args.d_branch_bias},
        block_body);
  } else {
    ForEachBlockWithColumnGrads<float>(rows, cols, work, {args.dweight, args.dbias}, block_body);
  }
  return absl::OkStatus();
}

}  // namespace nf::cpu
