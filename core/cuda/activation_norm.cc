// NormFormer's fused FFN middle on the GPU runs as its composition (core/ops/composed_ops.h):
// activation, dropout and LayerNorm kernels in turn through the scratch tensor, the backward
// recomputing the activation first. Correct and no more memory than the unfused layer; a single
// fused kernel would save the scratch round trips.
#include "core/cuda/cuda_backend.h"
#include "core/ops/composed_ops.h"

namespace nf::cuda {

absl::Status CudaBackend::ActivationNormForward(const ops::ActivationNormArgs& args) {
  return ops::ComposedActivationNormForward(*this, args);
}

absl::Status CudaBackend::ActivationNormBackward(const ops::ActivationNormBackwardArgs& args) {
  return ops::ComposedActivationNormBackward(*this, args);
}

}  // namespace nf::cuda
