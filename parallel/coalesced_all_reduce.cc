#include "parallel/coalesced_all_reduce.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::parallel {

absl::Status AllReduceCoalesced(absl::Span<const Tensor> tensors, Communicator& group) {
  if (tensors.empty() || group.size() == 1) return absl::OkStatus();
  const Tensor& first = tensors.front();
  int64_t total = 0;
  for (const Tensor& t : tensors) {
    if (t.dtype() != first.dtype() || t.device() != first.device()) {
      return absl::InvalidArgumentError(absl::StrCat("AllReduceCoalesced: ", t.DebugString(),
                                                     " differs in dtype or device from ",
                                                     first.DebugString()));
    }
    total += t.numel();
  }
  NF_ASSIGN_OR_RETURN(const Tensor packed, ops::Zeros(first.dtype(), {total}, first.device()));
  std::vector<Tensor> slots;
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    NF_ASSIGN_OR_RETURN(Tensor slot, packed.View(offset, t.shape()));
    NF_RETURN_IF_ERROR(ops::Copy(t, slot));
    slots.push_back(std::move(slot));
    offset += t.numel();
  }
  NF_RETURN_IF_ERROR(group.AllReduce(packed, ReduceOp::kSum));
  for (size_t i = 0; i < tensors.size(); ++i) NF_RETURN_IF_ERROR(ops::Copy(slots[i], tensors[i]));
  return absl::OkStatus();
}

}  // namespace nf::parallel
