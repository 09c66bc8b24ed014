#include "model/linear.h"

#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::model {

absl::Status LinearForward(const Tensor& x, const Param& weight, const Param& bias,
                           const Tensor& y) {
  return ops::Gemm({.a = x, .b = weight.value, .c = y, .trans_b = true, .bias = bias.value});
}

absl::Status LinearBackward(const Tensor& x, const Param& weight, const Param& bias,
                            const Tensor& dy, const Tensor& dx, bool accumulate_dx) {
  // [out, in] += [T, out]^T [T, in]
  NF_RETURN_IF_ERROR(ops::Gemm({.a = dy, .b = x, .c = weight.grad, .trans_a = true, .beta = 1.0f}));
  if (bias.defined()) NF_RETURN_IF_ERROR(ops::BiasBackward(dy, bias.grad));
  // [T, in] (+)= [T, out] [out, in]
  return ops::Gemm({.a = dy, .b = weight.value, .c = dx, .beta = accumulate_dx ? 1.0f : 0.0f});
}

}  // namespace nf::model
