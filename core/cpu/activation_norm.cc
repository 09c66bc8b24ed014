// NormFormer's FFN middle, y = LayerNorm(dropout(act(x))), fused on the CPU: each row of x
// [rows, cols] goes through the activation, the dropout and the LayerNorm while it is in cache,
// by the same row kernels the unfused ops run (activation_rows.h, isa/norm_kernels.h), so the
// results are the unfused composition's bit for bit. fp16 / bf16 run that composition itself.
//
// The backward recomputes the activation from x with its derivative in one pass
// (ActivationKernels::value_and_derivative), so neither the activation's output nor the
// LayerNorm's input gradient ever makes a round trip through memory: per row it reads x and dy
// and writes dx, as the unfused activation backward alone does.
#include <algorithm>
#include <vector>

#include "core/cpu/activation_rows.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/isa/norm_kernels.h"
#include "core/cpu/kernel_util.h"
#include "core/cpu/layer_norm_blocks.h"
#include "core/ops/composed_ops.h"

namespace nf::cpu {
namespace {

// Work per element in scalar-flop equivalents (ParallelFor's grain): the activation, the
// dropout's Philox words and the LayerNorm's passes.
int64_t WorkPerElement(const ops::DropoutSpec& dropout, ops::Activation act, int64_t layer_norm) {
  return ActivationCost(act) + (dropout.p > 0.0f ? 4 : 0) + layer_norm;
}

}  // namespace

absl::Status CpuBackend::ActivationNormForward(const ops::ActivationNormArgs& args) {
  if (!UsesF32Kernels(args.x, args.weight)) return ops::ComposedActivationNormForward(*this, args);
  const ActivationKernels& activation = ActivationKernelsOf(args.act);
  const NormKernels& norm = Norm();
  const int64_t cols = ops::Cols(args.x);
  const float* x = args.x.data<float>();
  float* y = args.y.data<float>();
  const int64_t work = cols * WorkPerElement(args.dropout, args.act, 6);
  ParallelFor(ops::Rows(args.x), work, [&](int64_t begin, int64_t end) {
    float* a = RowBuffers(1, cols);  // [cols]: dropout(act(x)) of the row
    for (int64_t r = begin; r < end; ++r) {
      activation.forward(x + r * cols, a, cols);
      if (args.dropout.p > 0.0f) {
        Elementwise().dropout_row(DropoutRowOf(args.dropout, r), a, a, cols);
      }
      norm.forward(a, args.weight.data<float>(), args.bias.data<float>(), 1, cols, args.eps,
                   y + r * cols, args.mean.data<float>() + r, args.rstd.data<float>() + r);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::ActivationNormBackward(const ops::ActivationNormBackwardArgs& args) {
  if (!UsesF32Kernels(args.x, args.weight)) return ops::ComposedActivationNormBackward(*this, args);
  const ActivationKernels& activation = ActivationKernelsOf(args.act);
  const NormKernels& norm = Norm();
  const int64_t cols = ops::Cols(args.x);
  const float* x = args.x.data<float>();
  const float* dy = args.dy.data<float>();
  const float* w = args.weight.data<float>();
  const float* mean = args.mean.data<float>();
  const float* rstd = args.rstd.data<float>();
  float* dx = args.dx.data<float>();
  const bool dropout = args.dropout.p > 0.0f;
  const int64_t work = cols * WorkPerElement(args.dropout, args.act, 12);
  ForEachRowWithParamGrads<float>(
      ops::Rows(args.x), cols, work, args.dweight, args.dbias,
      [&](int64_t r, float* sum_w, float* sum_b) {
        // [4, cols]: the row's dropout(act(x)), act'(x), the LayerNorm's input gradient, and
        // the dropout's multipliers (keep_scale or 0: one Philox pass serves both uses).
        float* a = RowBuffers(4, cols);
        float* slope = a + cols;
        float* da = slope + cols;
        float* kept = da + cols;
        const int64_t at = r * cols;
        activation.value_and_derivative(x + at, a, slope, cols);
        if (dropout) {
          std::fill_n(kept, cols, 1.0f);
          Elementwise().dropout_row(DropoutRowOf(args.dropout, r), kept, kept, cols);
          Elementwise().apply_dropout_multipliers(kept, a, a, cols);
        }
        double sums[2];  // sum g, sum g * xhat over the row (g = dy * w)
        norm.backward_row_sums(a, dy + at, w, mean[r], rstd[r], cols, sums);
        norm.input_and_param_grad_row(a, dy + at, w, mean[r], rstd[r],
                                      static_cast<float>(sums[0] / cols),
                                      static_cast<float>(sums[1] / cols), cols, da, sum_w, sum_b);
        if (dropout) Elementwise().apply_dropout_multipliers(kept, da, da, cols);
        Elementwise().scale_columns(da, slope, dx + at, 1, cols);  // dx = da * act'(x)
      });
  return absl::OkStatus();
}

}  // namespace nf::cpu
