// Argument checks shared by the communicators, so that every implementation refuses the same
// calls with the same one-line message: "<op> on group <name>: <what is wrong with which
// tensor>". A group of one refusing what eight ranks would refuse keeps single-rank tests
// honest about multi-rank runs.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"
#include "parallel/communicator.h"

namespace nf::parallel::internal {

// An error of `code` whose message is "<op> on group <group>: <detail>".
absl::Status CommError(absl::StatusCode code, CommOp op, absl::string_view group,
                       absl::string_view detail);

// `tensor` (called `role` in the message) has storage.
absl::Status CheckDefined(CommOp op, absl::string_view group, absl::string_view role,
                          const Tensor& tensor);
// `tensor` is defined and of a dtype that reductions take (f32, f64, f16, bf16, i32, i64).
absl::Status CheckReducible(CommOp op, absl::string_view group, absl::string_view role,
                            const Tensor& tensor);
// AllGather: same dtype, output holds group_size inputs.
absl::Status CheckAllGather(absl::string_view group, int group_size, const Tensor& input,
                            const Tensor& output);
// ReduceScatter: same reducible dtype, input holds group_size outputs.
absl::Status CheckReduceScatter(absl::string_view group, int group_size, const Tensor& input,
                                const Tensor& output);
// Send/Recv: peer is another rank of the group.
absl::Status CheckPeer(CommOp op, absl::string_view group, int rank, int group_size, int peer,
                       const Tensor& tensor);
// A transfer of a batch (Communicator::StartBatch) is a send or a receive.
absl::Status CheckBatchable(CommOp op, absl::string_view group);
// Broadcast: root is a rank of the group.
absl::Status CheckRoot(absl::string_view group, int group_size, int root, const Tensor& tensor);

}  // namespace nf::parallel::internal
