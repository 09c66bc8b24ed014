// The residual add between a layer's attention and feed-forward blocks, fused on the CPU with the
// LayerNorms on either side of it: NormFormer's post-attention LayerNorm on the branch (when
// there) and the feed-forward block's input LayerNorm on the sum. Each row of [rows, cols] goes
// through all of it while in cache, by the row kernels the unfused ops run (isa/norm_kernels.h,
// the dropout and axpy kernels), with the parameter gradients in the LayerNorm's 64-row blocks,
// so the results are the unfused composition's bit for bit. Other dtypes run that composition.
//
// Unfused, a NormFormer layer makes six passes over [rows, cols] here (LayerNorm, dropout, cast,
// axpy, LayerNorm, each reading what the last wrote) and its backward four; fused, the forward
// reads x and branch and writes residual and y, the backward reads dy, residual, branch and
// d_residual and writes d_residual and d_branch.
#include <algorithm>

#include "core/cpu/activation_rows.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/isa/norm_kernels.h"
#include "core/cpu/kernel_util.h"
#include "core/cpu/layer_norm_blocks.h"
#include "core/ops/composed_ops.h"

namespace nf::cpu {
namespace {

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
  const int64_t cols = ops::Cols(args.residual);
  const bool dropout = args.dropout.p > 0.0f;
  const float* x = args.x.data<float>();
  const float* branch = args.branch.data<float>();
  float* residual = args.residual.data<float>();
  float* y = args.y.data<float>();
  const int64_t work = cols * ((args.norms_branch() ? 12 : 6) + (dropout ? 4 : 0) + 2);
  ParallelFor(ops::Rows(args.residual), work, [&](int64_t begin, int64_t end) {
    float* z = RowBuffers(1, cols);  // [cols]: the row's dropout(LayerNorm_branch(branch))
    for (int64_t r = begin; r < end; ++r) {
      const int64_t at = r * cols;
      const float* added = branch + at;
      if (args.norms_branch()) {
        norm.forward(added, args.branch_weight.data<float>(), args.branch_bias.data<float>(), 1,
                     cols, args.eps, z, args.branch_mean.data<float>() + r,
                     args.branch_rstd.data<float>() + r);
        added = z;
      }
      if (dropout) {
        elementwise.dropout_row(DropoutRowOf(args.dropout, r), added, z, cols);
        added = z;
      }
      std::copy_n(x + at, cols, residual + at);
      elementwise.axpy(1.0f, added, residual + at, cols);
      norm.forward(residual + at, args.weight.data<float>(), args.bias.data<float>(), 1, cols,
                   args.eps, y + at, args.mean.data<float>() + r, args.rstd.data<float>() + r);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::ResidualNormBackward(const ops::ResidualNormBackwardArgs& args) {
  if (!UsesF32Kernels(args)) return ops::ComposedResidualNormBackward(*this, args);
  const NormKernels& norm = Norm();
  const ElementwiseKernels& elementwise = Elementwise();
  const int64_t cols = ops::Cols(args.residual);
  const bool dropout = args.dropout.p > 0.0f;
  const float* dy = args.dy.data<float>();
  const float* residual = args.residual.data<float>();
  float* d_residual = args.d_residual.data<float>();
  float* d_branch = args.d_branch.data<float>();
  const float* mean = args.mean.data<float>();
  const float* rstd = args.rstd.data<float>();
  // d_residual += the LayerNorm's input gradient; returns dropout(d_residual) of the row, in
  // `buffer` when the dropout has to be applied.
  const auto residual_row = [&](int64_t r, float* buffer, float* sum_w, float* sum_b) {
    const int64_t at = r * cols;
    LayerNormBackwardRow(norm, residual + at, dy + at, args.weight.data<float>(), mean[r], rstd[r],
                         cols, buffer, sum_w, sum_b);
    elementwise.axpy(1.0f, buffer, d_residual + at, cols);
    if (!dropout) return static_cast<const float*>(d_residual + at);
    elementwise.dropout_row(DropoutRowOf(args.dropout, r), d_residual + at, buffer, cols);
    return static_cast<const float*>(buffer);
  };
  const int64_t rows = ops::Rows(args.residual);
  const int64_t work = cols * ((args.norms_branch() ? 24 : 12) + (dropout ? 4 : 0) + 2);
  if (!args.norms_branch()) {
    ForEachRowWithParamGrads<float>(
        rows, cols, work, args.dweight, args.dbias, [&](int64_t r, float* sum_w, float* sum_b) {
          const float* dz = residual_row(r, RowBuffers(1, cols), sum_w, sum_b);
          std::copy_n(dz, cols, d_branch + r * cols);
        });
    return absl::OkStatus();
  }
  const float* branch = args.branch.data<float>();
  ForEachRowWithColumnGrads<float>(
      rows, cols, work, {args.dweight, args.dbias, args.d_branch_weight, args.d_branch_bias},
      [&](int64_t r, float* sums) {
        const float* dz = residual_row(r, RowBuffers(1, cols), sums, sums + cols);
        LayerNormBackwardRow(norm, branch + r * cols, dz, args.branch_weight.data<float>(),
                             args.branch_mean.data<float>()[r], args.branch_rstd.data<float>()[r],
                             cols, d_branch + r * cols, sums + 2 * cols, sums + 3 * cols);
      });
  return absl::OkStatus();
}

}  // namespace nf::cpu
