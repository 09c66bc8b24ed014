// The vectorised activation and dropout kernels as the CPU ops apply them to a [tokens, cols]
// tensor, shared by the elementwise ops (elementwise.cc) and the fused activation + LayerNorm
// (activation_norm.cc), so that both compute every element with the same kernel.
#pragma once

#include <cstdint>

#include "core/cpu/isa/elementwise_kernels.h"
#include "core/ops/ops.h"

namespace nf::cpu {

// The fp32 kernels of `act` at the selected ISA level.
const ActivationKernels& ActivationKernelsOf(ops::Activation act);

// Work per element of the vectorised activations for ParallelFor's grain, in scalar-flop
// equivalents.
int64_t ActivationCost(ops::Activation act);

// Dropout of row r of a [tokens, cols] tensor under `spec` (spec.p > 0): the row's Philox
// coordinates (sample, position, first column) as ops::Dropout defines them.
DropoutRowArgs DropoutRowOf(const ops::DropoutSpec& spec, int64_t r);

}  // namespace nf::cpu
