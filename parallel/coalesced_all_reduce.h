// Sums many small tensors over a group with one all-reduce: packed into one buffer, reduced,
// unpacked. One collective's latency instead of one per tensor (the sequence-parallel
// LayerNorm and bias gradients are a few d-sized vectors per layer).
#pragma once

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/tensor.h"
#include "parallel/communicator.h"

namespace nf::parallel {

// Each tensor = its sum over `group`. The tensors share one dtype and device and do not
// overlap; the result is the same as one AllReduce of each.
absl::Status AllReduceCoalesced(absl::Span<const Tensor> tensors, Communicator& group);

}  // namespace nf::parallel
