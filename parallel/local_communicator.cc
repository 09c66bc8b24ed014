#include "parallel/local_communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/ops/ops.h"
#include "core/status.h"
#include "parallel/comm_checks.h"

namespace nf::parallel {
namespace {

// The handle of an operation that completed when it was issued.
class DoneHandle final : public CommHandle {
 public:
  absl::Status Wait() override { return absl::OkStatus(); }
};

}  // namespace

absl::Status LocalCommunicator::AllReduce(const Tensor& tensor, ReduceOp /*op*/) {
  NF_RETURN_IF_ERROR(internal::CheckReducible(CommOp::kAllReduce, name_, "tensor", tensor));
  Count(CommOp::kAllReduce, static_cast<int64_t>(tensor.nbytes()));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CommHandle>> LocalCommunicator::AllReduceAsync(const Tensor& tensor,
                                                                              ReduceOp op) {
  NF_RETURN_IF_ERROR(AllReduce(tensor, op));
  return std::make_unique<DoneHandle>();
}

absl::Status LocalCommunicator::ReduceScatter(const Tensor& input, const Tensor& output) {
  NF_RETURN_IF_ERROR(internal::CheckReduceScatter(name_, 1, input, output));
  NF_RETURN_IF_ERROR(Copy(CommOp::kReduceScatter, input, output));
  Count(CommOp::kReduceScatter, static_cast<int64_t>(input.nbytes()));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CommHandle>> LocalCommunicator::ReduceScatterAsync(
    const Tensor& input, const Tensor& output) {
  NF_RETURN_IF_ERROR(ReduceScatter(input, output));
  return std::make_unique<DoneHandle>();
}

absl::StatusOr<std::unique_ptr<CommHandle>> LocalCommunicator::AllGatherAsync(
    const Tensor& input, const Tensor& output) {
  NF_RETURN_IF_ERROR(AllGather(input, output));
  return std::make_unique<DoneHandle>();
}

absl::Status LocalCommunicator::AllGather(const Tensor& input, const Tensor& output) {
  NF_RETURN_IF_ERROR(internal::CheckAllGather(name_, 1, input, output));
  NF_RETURN_IF_ERROR(Copy(CommOp::kAllGather, input, output));
  Count(CommOp::kAllGather, static_cast<int64_t>(output.nbytes()));
  return absl::OkStatus();
}

absl::Status LocalCommunicator::Broadcast(const Tensor& tensor, int root) {
  NF_RETURN_IF_ERROR(internal::CheckRoot(name_, 1, root, tensor));
  Count(CommOp::kBroadcast, static_cast<int64_t>(tensor.nbytes()));
  return absl::OkStatus();
}

absl::Status LocalCommunicator::Send(const Tensor& tensor, int peer) {
  // Always an error: the only rank is this one.
  return internal::CheckPeer(CommOp::kSend, name_, 0, 1, peer, tensor);
}

absl::Status LocalCommunicator::Recv(const Tensor& tensor, int peer) {
  return internal::CheckPeer(CommOp::kRecv, name_, 0, 1, peer, tensor);
}

absl::StatusOr<std::unique_ptr<CommHandle>> LocalCommunicator::SendAsync(const Tensor& tensor,
                                                                         int peer) {
  NF_RETURN_IF_ERROR(Send(tensor, peer));
  return std::make_unique<DoneHandle>();  // unreachable: Send always fails
}

absl::StatusOr<std::unique_ptr<CommHandle>> LocalCommunicator::RecvAsync(const Tensor& tensor,
                                                                         int peer) {
  NF_RETURN_IF_ERROR(Recv(tensor, peer));
  return std::make_unique<DoneHandle>();  // unreachable: Recv always fails
}

absl::Status LocalCommunicator::Barrier() {
  Count(CommOp::kBarrier, 0);
  return absl::OkStatus();
}

absl::Status LocalCommunicator::Copy(CommOp op, const Tensor& input, const Tensor& output) {
  if (input.device() != output.device()) {
    return internal::CommError(absl::StatusCode::kInvalidArgument, op, name_,
                               absl::StrCat("input ", input.DebugString(), " and output ",
                                            output.DebugString(), " are on different devices"));
  }
  if (input.raw_data() == output.raw_data()) return absl::OkStatus();
  if (input.device().type == DeviceType::kCpu) {
    // memmove: a view of the output may be passed as the input (in-place gather).
    std::memmove(output.raw_data(), input.raw_data(), input.nbytes());
    return absl::OkStatus();
  }
  if (IsFloating(input.dtype())) return ops::Cast(input, output);
  return internal::CommError(
      absl::StatusCode::kUnimplemented, op, name_,
      absl::StrCat("copying ", input.DebugString(),
                   " needs a device copy of integer tensors, which the op table does not have"));
}

}  // namespace nf::parallel
