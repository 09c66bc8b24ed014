#include "parallel/agreement.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace nf::parallel {

absl::Status LowestRankError(const absl::Status& local, Communicator& group) {
  // size - rank for a rank with an error, 0 without: the maximum names the lowest such rank.
  NF_ASSIGN_OR_RETURN(const Tensor lowest, Tensor::HostZeros(DType::kI64, {1}));
  *lowest.data<int64_t>() = local.ok() ? 0 : group.size() - group.rank();
  NF_RETURN_IF_ERROR(group.AllReduce(lowest, ReduceOp::kMax));
  if (*lowest.data<int64_t>() == 0) return absl::OkStatus();
  const int root = group.size() - static_cast<int>(*lowest.data<int64_t>());

  constexpr int64_t kMaxMessage = 4096;
  NF_ASSIGN_OR_RETURN(const Tensor code, Tensor::HostZeros(DType::kI64, {1}));
  NF_ASSIGN_OR_RETURN(const Tensor message, Tensor::HostZeros(DType::kU8, {kMaxMessage + 1}));
  if (group.rank() == root) {
    *code.data<int64_t>() = static_cast<int64_t>(local.code());
    const size_t length = std::min<size_t>(local.message().size(), kMaxMessage);
    std::memcpy(message.data<uint8_t>(), local.message().data(), length);
  }
  NF_RETURN_IF_ERROR(group.Broadcast(code, root));
  NF_RETURN_IF_ERROR(group.Broadcast(message, root));
  // The last byte is never written: the text ends at the first zero.
  return absl::Status(static_cast<absl::StatusCode>(*code.data<int64_t>()),
                      reinterpret_cast<const char*>(message.data<uint8_t>()));
}

}  // namespace nf::parallel
