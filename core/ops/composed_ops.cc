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

}  // namespace nf::ops
