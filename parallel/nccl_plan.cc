#include "parallel/nccl_plan.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "parallel/comm_checks.h"

namespace nf::parallel::internal {
namespace {

const char* Bytes(const Tensor& t) { return static_cast<const char*>(t.raw_data()); }

bool Overlap(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  return Bytes(a) < Bytes(b) + b.nbytes() && Bytes(b) < Bytes(a) + a.nbytes();
}

// `block` and `whole` (size ranks x block) either do not overlap or `block` is exactly this
// rank's block of `whole`: the only aliasing NCCL defines for reduce-scatter and all-gather.
absl::Status CheckAliasing(CommOp op, const NcclCaller& caller, absl::string_view block_role,
                           const Tensor& block, absl::string_view whole_role, const Tensor& whole) {
  if (!Overlap(block, whole)) return absl::OkStatus();
  if (Bytes(block) == Bytes(whole) + caller.rank * block.nbytes()) return absl::OkStatus();
  return CommError(absl::StatusCode::kInvalidArgument, op, caller.group,
                   absl::StrCat(block_role, " ", block.DebugString(), " overlaps ", whole_role, " ",
                                whole.DebugString(), " other than as rank ", caller.rank,
                                "'s block of it; NCCL takes separate buffers or that in-place "
                                "layout"));
}

}  // namespace

int CommStreamPriority(int least_priority, int greatest_priority) {
  // CUDA's priorities run from least (0) down to greatest (negative); a device without
  // priorities reports 0 for both.
  return greatest_priority <= least_priority ? greatest_priority : least_priority;
}

std::optional<ncclDataType_t> NcclReduceType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU16:
    case DType::kU8:
      break;
  }
  return std::nullopt;
}

ncclRedOp_t NcclReduceOp(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

absl::Status CheckOnDevice(CommOp op, absl::string_view group, absl::string_view role,
                           const Tensor& tensor, int device) {
  if (tensor.device() == Device::Cuda(device)) return absl::OkStatus();
  return CommError(
      absl::StatusCode::kInvalidArgument, op, group,
      absl::StrCat(role, " ", tensor.DebugString(), " is not on ", Device::Cuda(device).ToString(),
                   ", the device of this NCCL communicator",
                   tensor.device().type == DeviceType::kCpu
                       ? " (CPU tensors go through MpiCommunicator)"
                       : ""));
}

absl::StatusOr<NcclPlan> PlanAllReduce(const NcclCaller& caller, const Tensor& tensor,
                                       ReduceOp op) {
  constexpr CommOp kOp = CommOp::kAllReduce;
  NF_RETURN_IF_ERROR(CheckReducible(kOp, caller.group, "tensor", tensor));
  NF_RETURN_IF_ERROR(CheckOnDevice(kOp, caller.group, "tensor", tensor, caller.device));
  return NcclPlan{.send = tensor.raw_data(),
                  .recv = tensor.raw_data(),
                  .count = static_cast<size_t>(tensor.numel()),
                  .type = *NcclReduceType(tensor.dtype()),
                  .reduce = NcclReduceOp(op),
                  .bytes = static_cast<int64_t>(tensor.nbytes())};
}

absl::StatusOr<NcclPlan> PlanReduceScatter(const NcclCaller& caller, const Tensor& input,
                                           const Tensor& output) {
  constexpr CommOp kOp = CommOp::kReduceScatter;
  NF_RETURN_IF_ERROR(CheckReduceScatter(caller.group, caller.size, input, output));
  NF_RETURN_IF_ERROR(CheckOnDevice(kOp, caller.group, "input", input, caller.device));
  NF_RETURN_IF_ERROR(CheckOnDevice(kOp, caller.group, "output", output, caller.device));
  NF_RETURN_IF_ERROR(CheckAliasing(kOp, caller, "output", output, "input", input));
  return NcclPlan{.send = input.raw_data(),
                  .recv = output.raw_data(),
                  .count = static_cast<size_t>(output.numel()),
                  .type = *NcclReduceType(input.dtype()),
                  .reduce = ncclSum,
                  .bytes = static_cast<int64_t>(input.nbytes())};
}

absl::StatusOr<NcclPlan> PlanAllGather(const NcclCaller& caller, const Tensor& input,
                                       const Tensor& output) {
  constexpr CommOp kOp = CommOp::kAllGather;
  NF_RETURN_IF_ERROR(CheckAllGather(caller.group, caller.size, input, output));
  NF_RETURN_IF_ERROR(CheckOnDevice(kOp, caller.group, "input", input, caller.device));
  NF_RETURN_IF_ERROR(CheckOnDevice(kOp, caller.group, "output", output, caller.device));
  NF_RETURN_IF_ERROR(CheckAliasing(kOp, caller, "input", input, "output", output));
  return NcclPlan{.send = input.raw_data(),
                  .recv = output.raw_data(),
                  .count = input.nbytes(),
                  .type = ncclUint8,
                  .bytes = static_cast<int64_t>(output.nbytes())};
}

absl::StatusOr<NcclPlan> PlanBroadcast(const NcclCaller& caller, const Tensor& tensor, int root) {
  NF_RETURN_IF_ERROR(CheckRoot(caller.group, caller.size, root, tensor));
  NF_RETURN_IF_ERROR(
      CheckOnDevice(CommOp::kBroadcast, caller.group, "tensor", tensor, caller.device));
  return NcclPlan{.send = tensor.raw_data(),
                  .recv = tensor.raw_data(),
                  .count = tensor.nbytes(),
                  .type = ncclUint8,
                  .peer = root,
                  .bytes = static_cast<int64_t>(tensor.nbytes())};
}

absl::StatusOr<NcclPlan> PlanPointToPoint(const NcclCaller& caller, CommOp op, const Tensor& tensor,
                                          int peer) {
  NF_RETURN_IF_ERROR(CheckPeer(op, caller.group, caller.rank, caller.size, peer, tensor));
  NF_RETURN_IF_ERROR(CheckOnDevice(op, caller.group, "tensor", tensor, caller.device));
  return NcclPlan{.send = op == CommOp::kSend ? tensor.raw_data() : nullptr,
                  .recv = op == CommOp::kRecv ? tensor.raw_data() : nullptr,
                  .count = tensor.nbytes(),
                  .type = ncclUint8,
                  .peer = peer,
                  .bytes = static_cast<int64_t>(tensor.nbytes())};
}

}  // namespace nf::parallel::internal
