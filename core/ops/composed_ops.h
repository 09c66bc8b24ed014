// Fused ops written as the sequence of unfused ones they stand for, on one backend. A backend
// without a fused kernel for an op (or for a dtype) runs these; the fused kernels are tested
// against them.
#pragma once

#include "absl/status/status.h"
#include "core/ops/backend.h"

namespace nf::ops {

// The LayerNorm inside a fused activation + LayerNorm, reading `a` (the activation's output).
LayerNormArgs LayerNormOf(const ActivationNormArgs& args, const Tensor& a);
LayerNormBackwardArgs LayerNormBackwardOf(const ActivationNormBackwardArgs& args, const Tensor& a);

// scratch = dropout(act(x)); y = LayerNorm(scratch).
absl::Status ComposedActivationNormForward(Backend& backend, const ActivationNormArgs& args);

// scratch = dropout(act(x)) again; dx = LayerNorm backward (dy, scratch); dx = dropout(dx);
// dx = act backward (x, dx).
absl::Status ComposedActivationNormBackward(Backend& backend,
                                            const ActivationNormBackwardArgs& args);

// The LayerNorms of a fused residual add, as unfused ops read them: the branch's (x = branch,
// y = scratch) and the residual's.
LayerNormArgs BranchNormOf(const ResidualNormArgs& args);
LayerNormArgs ResidualNormOf(const ResidualNormArgs& args);
// Their backwards: the residual's from dy into dx, the branch's from dy into d_branch.
LayerNormBackwardArgs ResidualNormBackwardOf(const ResidualNormBackwardArgs& args,
                                             const Tensor& dx);
LayerNormBackwardArgs BranchNormBackwardOf(const ResidualNormBackwardArgs& args, const Tensor& dy);

// scratch = dropout(LayerNorm_branch(branch) or branch); residual = x; residual += scratch;
// y = LayerNorm(residual).
absl::Status ComposedResidualNormForward(Backend& backend, const ResidualNormArgs& args);

// scratch = LayerNorm backward (dy, residual); d_residual += scratch; then with the branch
// LayerNorm scratch = dropout(d_residual) and d_branch = its LayerNorm backward (scratch,
// branch), without it d_branch = dropout(d_residual).
absl::Status ComposedResidualNormBackward(Backend& backend, const ResidualNormBackwardArgs& args);

// tokens = MergeHeads(heads); tokens viewed [tokens, heads, head_dim] *= scale per head.
absl::Status ComposedMergeScaledHeads(Backend& backend, const Tensor& heads, const Tensor& scale,
                                      const Tensor& tokens);

// d_heads = SplitHeads(d_tokens); ScaleChannelsBackward(heads, scale, seq * head_dim) in place.
absl::Status ComposedMergeScaledHeadsBackward(Backend& backend, const Tensor& d_tokens,
                                              const Tensor& heads, const Tensor& scale,
                                              const Tensor& d_heads, const Tensor& dscale);

}  // namespace nf::ops
