#include "core/ops/composed_ops.h"

#include "core/status.h"

namespace nf::ops {

absl::Status ComposedActivationNormForward(Backend& backend, const ActivationNormArgs& args) {
  NF_RETURN_IF_ERROR(backend.ActivationForward(args.act, args.x, args.scratch));
  NF_RETURN_IF_ERROR(backend.Dropout(args.scratch, args.scratch, args.dropout));
  return backend.LayerNormForward({.x = args.scratch,
                                   .weight = args.weight,
                                   .bias = args.bias,
                                   .y = args.y,
                                   .mean = args.mean,
                                   .rstd = args.rstd,
                                   .eps = args.eps});
}

absl::Status ComposedActivationNormBackward(Backend& backend,
                                            const ActivationNormBackwardArgs& args) {
  NF_RETURN_IF_ERROR(backend.ActivationForward(args.act, args.x, args.scratch));
  NF_RETURN_IF_ERROR(backend.Dropout(args.scratch, args.scratch, args.dropout));
  NF_RETURN_IF_ERROR(backend.LayerNormBackward({.dy = args.dy,
                                                .x = args.scratch,
                                                .weight = args.weight,
                                                .mean = args.mean,
                                                .rstd = args.rstd,
                                                .dx = args.dx,
                                                .dweight = args.dweight,
                                                .dbias = args.dbias}));
  NF_RETURN_IF_ERROR(backend.Dropout(args.dx, args.dx, args.dropout));
  return backend.ActivationBackward(args.act, args.x, args.dx, args.dx);
}

}  // namespace nf::ops
