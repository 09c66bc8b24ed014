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

}  // namespace nf::ops
