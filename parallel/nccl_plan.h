// The host half of the NCCL communicator (nccl_communicator.h): for each call, the checks and
// the arguments it hands NCCL (buffers, element count, datatype, operation, the bytes it
// counts), computed before anything touches the GPU. Kept apart from the CUDA calls so that
// every refusal and every in-place layout is tested without a GPU (the host tests of
// tests/parallel/nccl_communicator_mpi.cc). Internal to parallel/.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"
#include "parallel/communicator.h"

namespace nf::parallel::internal {

// Who is calling: the group's name and this rank's place in it, and the CUDA device whose
// tensors the communicator moves.
struct NcclCaller {
  absl::string_view group;
  int rank = 0;
  int size = 1;
  int device = 0;
};

// One NCCL call's arguments. Operations that only move data (all-gather, broadcast, send,
// recv) move bytes, so every dtype travels, u8 and u16 included.
struct NcclPlan {
  const void* send = nullptr;
  void* recv = nullptr;
  // Elements of `type` as NCCL counts them: the tensor's (all-reduce, broadcast, send, recv),
  // the output's (reduce-scatter) or the input's (all-gather).
  size_t count = 0;
  ncclDataType_t type = ncclUint8;
  ncclRedOp_t reduce = ncclSum;
  int peer = -1;      // broadcast: the root; send/recv: the other rank
  int64_t bytes = 0;  // what the call counts (communicator.h)
};

// The priority of the communication stream, given cudaDeviceGetStreamPriorityRange's least and
// greatest: the greatest (CUDA counts priorities down: greatest is the numerically lowest, -5
// against 0 on Ampere and Hopper), so that NCCL's kernels are scheduled ahead of the compute
// stream's queued ones.
int CommStreamPriority(int least_priority, int greatest_priority);

// The NCCL type that reduces `dtype` in its own precision; nullopt for dtypes that are not
// reduced (u8, u16).
std::optional<ncclDataType_t> NcclReduceType(DType dtype);
ncclRedOp_t NcclReduceOp(ReduceOp op);

// `tensor` (called `role` in the message) lives on cuda:<device>.
absl::Status CheckOnDevice(CommOp op, absl::string_view group, absl::string_view role,
                           const Tensor& tensor, int device);

absl::StatusOr<NcclPlan> PlanAllReduce(const NcclCaller& caller, const Tensor& tensor, ReduceOp op);
// The output may be this rank's block of the input (NCCL's in-place reduce-scatter); any other
// overlap is refused.
absl::StatusOr<NcclPlan> PlanReduceScatter(const NcclCaller& caller, const Tensor& input,
                                           const Tensor& output);
// The input may be this rank's block of the output (NCCL's in-place all-gather, ZeRO's
// parameter gather); any other overlap is refused.
absl::StatusOr<NcclPlan> PlanAllGather(const NcclCaller& caller, const Tensor& input,
                                       const Tensor& output);
absl::StatusOr<NcclPlan> PlanBroadcast(const NcclCaller& caller, const Tensor& tensor, int root);
// op is kSend or kRecv.
absl::StatusOr<NcclPlan> PlanPointToPoint(const NcclCaller& caller, CommOp op, const Tensor& tensor,
                                          int peer);

}  // namespace nf::parallel::internal
