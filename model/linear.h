// Dense layers in fairseq's convention: W [out, in], y = x W^T + b. The weight and bias
// gradients are fp32 views of the main-gradient buffer and accumulate.
#pragma once

#include "absl/status/status.h"
#include "core/tensor.h"

namespace nf::model {

// A parameter's value (model dtype) and gradient (fp32), both views into the flat buffers.
struct Param {
  Tensor value;
  Tensor grad;
  bool defined() const { return value.defined(); }
};

// y [T, out] = x [T, in] W^T + b (no bias when `bias` is undefined).
absl::Status LinearForward(const Tensor& x, const Param& weight, const Param& bias,
                           const Tensor& y);

// dW += dy^T x, db += column sums of dy; dx = dy W, or dx += dy W when accumulate_dx.
absl::Status LinearBackward(const Tensor& x, const Param& weight, const Param& bias,
                            const Tensor& dy, const Tensor& dx, bool accumulate_dx);

}  // namespace nf::model
