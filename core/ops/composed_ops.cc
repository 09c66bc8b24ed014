#include "core/ops/composed_ops.h"

#include "core/status.h"

namespace nf::ops {

LayerNormArgs LayerNormOf(const ActivationNormArgs& args, const Tensor& a) {
  return {.x = a,
          .weight = args.weight,
          .bias = args.bias,
          .y = args.y,
          .mean = args.mean,
          .rstd = args.rstd,
          .eps = args.eps};
}

LayerNormBackwardArgs LayerNormBackwardOf(const ActivationNormBackwardArgs& args, const Tensor& a) {
  return {.dy = args.dy,
          .x = a,
          .weight = args.weight,
          .mean = args.mean,
          .rstd = args.rstd,
          .dx = args.dx,
          .dweight = args.dweight,
          .dbias = args.dbias};
}

absl::Status ComposedActivationNormForward(Backend& backend, const ActivationNormArgs& args) {
  NF_RETURN_IF_ERROR(backend.ActivationForward(args.act, args.x, args.scratch));
  NF_RETURN_IF_ERROR(backend.Dropout(args.scratch, args.scratch, args.dropout));
  return backend.LayerNormForward(LayerNormOf(args, args.scratch));
}

absl::Status ComposedActivationNormBackward(Backend& backend,
                                            const ActivationNormBackwardArgs& args) {
  NF_RETURN_IF_ERROR(backend.ActivationForward(args.act, args.x, args.scratch));
  NF_RETURN_IF_ERROR(backend.Dropout(args.scratch, args.scratch, args.dropout));
  NF_RETURN_IF_ERROR(backend.LayerNormBackward(LayerNormBackwardOf(args, args.scratch)));
  NF_RETURN_IF_ERROR(backend.Dropout(args.dx, args.dx, args.dropout));
  return backend.ActivationBackward(args.act, args.x, args.dx, args.dx);
}

LayerNormArgs BranchNormOf(const ResidualNormArgs& args) {
  return {.x = args.branch,
          .weight = args.branch_weight,
          .bias = args.branch_bias,
          .y = args.scratch,
          .mean = args.branch_mean,
          .rstd = args.branch_rstd,
          .eps = args.eps};
}

LayerNormArgs ResidualNormOf(const ResidualNormArgs& args) {
  return {.x = args.residual,
          .weight = args.weight,
          .bias = args.bias,
          .y = args.y,
          .mean = args.mean,
          .rstd = args.rstd,
          .eps = args.eps};
}

LayerNormBackwardArgs ResidualNormBackwardOf(const ResidualNormBackwardArgs& args,
                                             const Tensor& dx) {
  return {.dy = args.dy,
          .x = args.residual,
          .weight = args.weight,
          .mean = args.mean,
          .rstd = args.rstd,
          .dx = dx,
          .dweight = args.dweight,
          .dbias = args.dbias};
}

LayerNormBackwardArgs BranchNormBackwardOf(const ResidualNormBackwardArgs& args, const Tensor& dy) {
  return {.dy = dy,
          .x = args.branch,
          .weight = args.branch_weight,
          .mean = args.branch_mean,
          .rstd = args.branch_rstd,
          .dx = args.d_branch,
          .dweight = args.d_branch_weight,
          .dbias = args.d_branch_bias};
}

absl::Status ComposedResidualNormForward(Backend& backend, const ResidualNormArgs& args) {
  if (args.norms_branch()) {
    NF_RETURN_IF_ERROR(backend.LayerNormForward(BranchNormOf(args)));
    NF_RETURN_IF_ERROR(backend.Dropout(args.scratch, args.scratch, args.dropout));
  } else {
    NF_RETURN_IF_ERROR(backend.Dropout(args.branch, args.scratch, args.dropout));
  }
  NF_RETURN_IF_ERROR(backend.Cast(args.x, args.residual));
  NF_RETURN_IF_ERROR(backend.Axpy(1.0f, args.scratch, args.residual));
  return backend.LayerNormForward(ResidualNormOf(args));
}

absl::Status ComposedResidualNormBackward(Backend& backend, const ResidualNormBackwardArgs& args) {
  NF_RETURN_IF_ERROR(backend.LayerNormBackward(ResidualNormBackwardOf(args, args.scratch)));
  NF_RETURN_IF_ERROR(backend.Axpy(1.0f, args.scratch, args.d_residual));
  if (!args.norms_branch()) return backend.Dropout(args.d_residual, args.d_branch, args.dropout);
  NF_RETURN_IF_ERROR(backend.Dropout(args.d_residual, args.scratch, args.dropout));
  return backend.LayerNormBackward(BranchNormBackwardOf(args, args.scratch));
}

absl::Status ComposedMergeScaledHeads(Backend& backend, const Tensor& heads, const Tensor& scale,
                                      const Tensor& tokens) {
  NF_RETURN_IF_ERROR(backend.MergeHeads(heads, tokens));
  return backend.ScaleChannels(tokens, scale, /*inner=*/heads.dim(3), tokens);
}

absl::Status ComposedMergeScaledHeadsBackward(Backend& backend, const Tensor& d_tokens,
                                              const Tensor& heads, const Tensor& scale,
                                              const Tensor& d_heads, const Tensor& dscale) {
  NF_RETURN_IF_ERROR(backend.SplitHeads(d_tokens, d_heads));
  const int64_t per_head = heads.dim(2) * heads.dim(3);  // seq * head_dim
  return backend.ScaleChannelsBackward(heads, scale, per_head, d_heads, d_heads, dscale);
}

}  // namespace nf::ops
