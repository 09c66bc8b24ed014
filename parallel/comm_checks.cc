#include "parallel/comm_checks.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace nf::parallel::internal {

absl::Status CommError(absl::StatusCode code, CommOp op, absl::string_view group,
                       absl::string_view detail) {
  return absl::Status(code, absl::StrCat(CommOpName(op), " on group ", group, ": ", detail));
}

absl::Status CheckDefined(CommOp op, absl::string_view group, absl::string_view role,
                          const Tensor& tensor) {
  if (tensor.defined()) return absl::OkStatus();
  return CommError(absl::StatusCode::kInvalidArgument, op, group,
                   absl::StrCat(role, " is an undefined tensor (no storage)"));
}

absl::Status CheckReducible(CommOp op, absl::string_view group, absl::string_view role,
                            const Tensor& tensor) {
  NF_RETURN_IF_ERROR(CheckDefined(op, group, role, tensor));
  switch (tensor.dtype()) {
    case DType::kF32:
    case DType::kF64:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI32:
    case DType::kI64:
      return absl::OkStatus();
    case DType::kU16:
    case DType::kU8:
      break;
  }
  return CommError(
      absl::StatusCode::kInvalidArgument, op, group,
      absl::StrCat(role, " ", tensor.DebugString(), " has dtype ", DTypeName(tensor.dtype()),
                   "; reductions take f32, f64, f16, bf16, i32 or i64"));
}

absl::Status CheckAllGather(absl::string_view group, int group_size, const Tensor& input,
                            const Tensor& output) {
  constexpr CommOp op = CommOp::kAllGather;
  NF_RETURN_IF_ERROR(CheckDefined(op, group, "input", input));
  NF_RETURN_IF_ERROR(CheckDefined(op, group, "output", output));
  if (input.dtype() != output.dtype()) {
    return CommError(absl::StatusCode::kInvalidArgument, op, group,
                     absl::StrCat("output ", output.DebugString(), " and input ",
                                  input.DebugString(), " differ in dtype"));
  }
  if (output.numel() != group_size * input.numel()) {
    return CommError(absl::StatusCode::kInvalidArgument, op, group,
                     absl::StrCat("output ", output.DebugString(), " has ", output.numel(),
                                  " elements; ", group_size, " ranks x input ", input.DebugString(),
                                  " need ", group_size * input.numel()));
  }
  return absl::OkStatus();
}

absl::Status CheckReduceScatter(absl::string_view group, int group_size, const Tensor& input,
                                const Tensor& output) {
  constexpr CommOp op = CommOp::kReduceScatter;
  NF_RETURN_IF_ERROR(CheckReducible(op, group, "input", input));
  NF_RETURN_IF_ERROR(CheckDefined(op, group, "output", output));
  if (input.dtype() != output.dtype()) {
    return CommError(absl::StatusCode::kInvalidArgument, op, group,
                     absl::StrCat("output ", output.DebugString(), " and input ",
                                  input.DebugString(), " differ in dtype"));
  }
  if (input.numel() != group_size * output.numel()) {
    return CommError(absl::StatusCode::kInvalidArgument, op, group,
                     absl::StrCat("input ", input.DebugString(), " has ", input.numel(),
                                  " elements; ", group_size, " ranks x output ",
                                  output.DebugString(), " need ", group_size * output.numel()));
  }
  return absl::OkStatus();
}

absl::Status CheckPeer(CommOp op, absl::string_view group, int rank, int group_size, int peer,
                       const Tensor& tensor) {
  NF_RETURN_IF_ERROR(CheckDefined(op, group, "tensor", tensor));
  if (peer < 0 || peer >= group_size) {
    return CommError(
        absl::StatusCode::kInvalidArgument, op, group,
        absl::StrCat("peer ", peer, " is out of range for a group of ", group_size,
                     group_size == 1 ? " rank" : " ranks", " (tensor ", tensor.DebugString(), ")"));
  }
  if (peer == rank) {
    return CommError(absl::StatusCode::kInvalidArgument, op, group,
                     absl::StrCat("peer ", peer, " is this rank (tensor ", tensor.DebugString(),
                                  "); point-to-point needs another rank"));
  }
  return absl::OkStatus();
}

absl::Status CheckBatchable(CommOp op, absl::string_view group) {
  if (op == CommOp::kSend || op == CommOp::kRecv) return absl::OkStatus();
  return CommError(absl::StatusCode::kInvalidArgument, op, group,
                   "a batch holds sends and receives only");
}

absl::Status CheckRoot(absl::string_view group, int group_size, int root, const Tensor& tensor) {
  constexpr CommOp op = CommOp::kBroadcast;
  NF_RETURN_IF_ERROR(CheckDefined(op, group, "tensor", tensor));
  if (root < 0 || root >= group_size) {
    return CommError(
        absl::StatusCode::kInvalidArgument, op, group,
        absl::StrCat("root ", root, " is out of range for a group of ", group_size,
                     group_size == 1 ? " rank" : " ranks", " (tensor ", tensor.DebugString(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace nf::parallel::internal
