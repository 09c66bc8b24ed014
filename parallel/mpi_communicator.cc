#include "parallel/mpi_communicator.h"

#include <climits>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/ops/ops.h"
#include "core/status.h"
#include "core/trace_range.h"
#include "parallel/comm_checks.h"
#include "parallel/flight_recorder.h"
#include "parallel/mpi_runtime.h"

namespace nf::parallel {
namespace {

using internal::CommError;

absl::Status MpiError(absl::string_view operation, absl::string_view group, int code,
                      absl::string_view context) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return absl::InternalError(absl::StrCat(operation, " on group ", group, ": ", context,
                                          ": MPI error: ", absl::string_view(text, length)));
}

// The MPI datatype that moves elements of `dtype`; 16-bit floats travel as their bits (they
// are never reduced by MPI, see StartAllReduce).
MPI_Datatype ElementType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kF16:
    case DType::kBF16:
    case DType::kU16:
      return MPI_UINT16_T;
    case DType::kU8:
      return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

bool ReducedInFp32(DType dtype) { return dtype == DType::kF16 || dtype == DType::kBF16; }

bool Overlap(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// The world rank of each member of `comm`, by rank in `comm`.
std::vector<int> WorldRanksOf(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  MPI_Group group, world;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(size), world_ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  MPI_Group_translate_ranks(group, size, ranks.data(), world, world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return world_ranks;
}

// Waits for `request` under the watchdog; for the collective steps of group creation, which
// have no CommHandle.
absl::Status WaitForRequest(MPI_Request* request, absl::string_view operation,
                            absl::string_view group, const std::vector<int>& world_ranks, int rank,
                            const WatchdogOptions& options) {
  std::vector<int> others = world_ranks;
  others.erase(others.begin() + rank);
  return WaitUnderWatchdog(
      [&]() -> absl::StatusOr<bool> {
        int flag = 0;
        const int rc = MPI_Test(request, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return MpiError(operation, group, rc, "waiting");
        return flag != 0;
      },
      {.operation = operation, .group = group, .group_ranks = world_ranks, .peers = others},
      options);
}

}  // namespace

// An operation in flight: the MPI request, what it touches, and what to do on completion.
class MpiPendingOp final : public CommHandle {
 public:
  MpiPendingOp(std::shared_ptr<const MpiCommunicator::GroupInfo> group,
               std::shared_ptr<CommStats> stats, CommOp op, const Tensor& tensor,
               WatchdogOptions watchdog)
      : group_(std::move(group)),
        stats_(std::move(stats)),
        op_(op),
        tensor_(tensor),
        watchdog_(watchdog) {}

  ~MpiPendingOp() override {
    // A request must complete before its buffers go away; waiting (under the watchdog) is the
    // only safe end for a handle the caller dropped.
    if (!waited_ && request != MPI_REQUEST_NULL && MpiActive()) Wait().IgnoreError();
  }

  absl::Status Wait() override {
    if (waited_) {
      return CommError(absl::StatusCode::kFailedPrecondition, op_, group_->name,
                       absl::StrCat("Wait() called twice on the handle of ", Describe()));
    }
    waited_ = true;
    MPI_Status status;
    const int peer[1] = {peer_world_rank};
    const absl::string_view operation = CommOpName(op_);
    const TraceRange trace(absl::StrCat("mpi ", operation, " wait on ", group_->name));
    const absl::Time start = absl::Now();
    FlightRecorder::Get().Waiting(flight);
    NF_RETURN_IF_ERROR(WaitUnderWatchdog(
        [&]() -> absl::StatusOr<bool> {
          int flag = 0;
          const int rc = MPI_Test(&request, &flag, &status);
          if (rc != MPI_SUCCESS) {
            return MpiError(operation, group_->name, rc, Describe());
          }
          return flag != 0;
        },
        {.operation = operation,
         .group = group_->name,
         .group_ranks = group_->world_ranks,
         .peers = peer_world_rank >= 0 ? absl::Span<const int>(peer)
                                       : absl::Span<const int>(group_->others)},
        watchdog_));
    stats_->seconds[static_cast<int>(op_)] += absl::ToDoubleSeconds(absl::Now() - start);
    FlightRecorder::Get().Completed(flight);
    if (expected_count >= 0) {
      int count = 0;
      MPI_Get_count(&status, datatype, &count);
      if (count != expected_count) {
        return CommError(absl::StatusCode::kInvalidArgument, op_, group_->name,
                         absl::StrCat("received ", count, " elements from peer ", peer_rank,
                                      " into ", Describe(), " of ", expected_count, " elements"));
      }
    }
    if (destination.defined()) {
      if (result.dtype() == destination.dtype()) {
        std::memcpy(destination.raw_data(), result.raw_data(), destination.nbytes());
      } else {
        NF_RETURN_IF_ERROR(ops::Cast(result, destination));  // fp32 -> f16/bf16, rounded once
      }
    }
    keep_alive.clear();
    return absl::OkStatus();
  }

  MPI_Request request = MPI_REQUEST_NULL;
  uint64_t flight = 0;  // the flight recorder's id of the operation
  // Tensors MPI reads or writes until completion, held so their storage outlives the request.
  std::vector<Tensor> keep_alive;
  // On completion `result` is copied (same dtype) or rounded (fp32 scratch) into `destination`.
  Tensor result, destination;
  // Point-to-point: the peer, and for Recv the element count and datatype to check.
  int peer_rank = -1;
  int peer_world_rank = -1;
  int expected_count = -1;
  MPI_Datatype datatype = MPI_DATATYPE_NULL;

 private:
  // Formatted only for errors: the tensor's description is not built on the fast path.
  std::string Describe() const {
    return tensor_.defined() ? absl::StrCat("tensor ", tensor_.DebugString()) : "no tensor";
  }

  std::shared_ptr<const MpiCommunicator::GroupInfo> group_;
  std::shared_ptr<CommStats> stats_;  // the communicator's: the wait is added at completion
  CommOp op_;
  Tensor tensor_;  // the caller's tensor (the output of gathers and scatters)
  WatchdogOptions watchdog_;
  bool waited_ = false;
};

// ---- Creation -----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::World(Options options) {
  return Duplicate(MPI_COMM_WORLD, "world", options);
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Duplicate(MPI_Comm comm,
                                                                            std::string name,
                                                                            Options options) {
  NF_RETURN_IF_ERROR(InitMpi());
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = MPI_Comm_idup(comm, &dup, &request);
  if (rc != MPI_SUCCESS) return MpiError("duplicate", name, rc, "MPI_Comm_idup");
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  NF_RETURN_IF_ERROR(
      WaitForRequest(&request, "duplicate", name, WorldRanksOf(comm), rank, options.watchdog));
  return Adopt(dup, std::move(name), options);
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Adopt(MPI_Comm comm,
                                                                        std::string name,
                                                                        Options options) {
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  auto group = std::make_shared<GroupInfo>();
  group->name = std::move(name);
  group->world_ranks = WorldRanksOf(comm);
  group->others = group->world_ranks;
  group->others.erase(group->others.begin() + rank);
  FlightRecorder::Get().RegisterGroup(
      {.group = group->name, .backend = "mpi", .world_ranks = group->world_ranks});
  return std::unique_ptr<MpiCommunicator>(
      new MpiCommunicator(comm, std::move(group), rank, options));
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Split(int color, int key,
                                                                        std::string name) const {
  MPI_Request request = MPI_REQUEST_NULL;
  int rc = MPI_Ibarrier(comm_, &request);
  if (rc != MPI_SUCCESS) return MpiError("split", group_->name, rc, "MPI_Ibarrier");
  NF_RETURN_IF_ERROR(WaitForRequest(&request, absl::StrCat("split into ", name), group_->name,
                                    group_->world_ranks, rank_, options_.watchdog));
  MPI_Comm comm = MPI_COMM_NULL;
  rc = MPI_Comm_split(comm_, color == kNoGroup ? MPI_UNDEFINED : color, key, &comm);
  if (rc != MPI_SUCCESS) {
    return MpiError("split", group_->name, rc, absl::StrCat("MPI_Comm_split into ", name));
  }
  if (comm == MPI_COMM_NULL) return std::unique_ptr<MpiCommunicator>();
  return Adopt(comm, std::move(name), options_);
}

absl::Status MpiCommunicator::BroadcastBytes(absl::Span<uint8_t> bytes, int root) const {
  if (bytes.size() > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast of ", bytes.size(),
                                                   " bytes on group ", group_->name,
                                                   ": more than an MPI count holds"));
  }
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc =
      MPI_Ibcast(bytes.data(), static_cast<int>(bytes.size()), MPI_UINT8_T, root, comm_, &request);
  if (rc != MPI_SUCCESS) return MpiError("broadcast", group_->name, rc, "MPI_Ibcast of bytes");
  return WaitForRequest(&request, "broadcast", group_->name, group_->world_ranks, rank_,
                        options_.watchdog);
}

absl::StatusOr<int> MpiCommunicator::MaxOverGroup(int value) const {
  int result = value;
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = MPI_Iallreduce(MPI_IN_PLACE, &result, 1, MPI_INT, MPI_MAX, comm_, &request);
  if (rc != MPI_SUCCESS)
    return MpiError("all_reduce", group_->name, rc, "MPI_Iallreduce of an int");
  NF_RETURN_IF_ERROR(WaitForRequest(&request, "all_reduce", group_->name, group_->world_ranks,
                                    rank_, options_.watchdog));
  return result;
}

MpiCommunicator::~MpiCommunicator() {
  // After MPI_Finalize (a communicator destroyed by a static destructor at exit) there is
  // nothing left to free.
  if (comm_ != MPI_COMM_NULL && MpiActive()) MPI_Comm_free(&comm_);
}

// ---- Checks -------------------------------------------------------------------------------------

absl::Status MpiCommunicator::CheckCpu(CommOp op, absl::string_view role,
                                       const Tensor& tensor) const {
  if (tensor.device().type != DeviceType::kCpu) {
    return CommError(absl::StatusCode::kInvalidArgument, op, group_->name,
                     absl::StrCat(role, " ", tensor.DebugString(),
                                  " is not in host memory; MpiCommunicator moves CPU tensors "
                                  "(GPU tensors go through the NCCL communicator)"));
  }
  if (tensor.numel() > INT_MAX) {
    return CommError(absl::StatusCode::kInvalidArgument, op, group_->name,
                     absl::StrCat(role, " ", tensor.DebugString(), " has ", tensor.numel(),
                                  " elements, more than an MPI count holds (2^31 - 1)"));
  }
  return absl::OkStatus();
}

// ---- Operations ---------------------------------------------------------------------------------

std::unique_ptr<MpiPendingOp> MpiCommunicator::NewPendingOp(CommOp op, const Tensor& tensor) const {
  return std::make_unique<MpiPendingOp>(group_, shared_stats(), op, tensor, options_.watchdog);
}

absl::StatusOr<std::unique_ptr<MpiPendingOp>> MpiCommunicator::StartAllReduce(const Tensor& tensor,
                                                                              ReduceOp op) {
  constexpr CommOp kOp = CommOp::kAllReduce;
  NF_RETURN_IF_ERROR(internal::CheckReducible(kOp, group_->name, "tensor", tensor));
  NF_RETURN_IF_ERROR(CheckCpu(kOp, "tensor", tensor));
  auto pending = NewPendingOp(kOp, tensor);
  const MPI_Op mpi_op = op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
  const int count = static_cast<int>(tensor.numel());
  int rc;
  if (ReducedInFp32(tensor.dtype())) {
    NF_ASSIGN_OR_RETURN(Tensor scratch, Tensor::HostEmpty(DType::kF32, {tensor.numel()}));
    NF_RETURN_IF_ERROR(ops::Cast(tensor, scratch));
    rc = MPI_Iallreduce(MPI_IN_PLACE, scratch.raw_data(), count, MPI_FLOAT, mpi_op, comm_,
                        &pending->request);
    pending->result = scratch;
    pending->destination = tensor;
  } else {
    rc = MPI_Iallreduce(MPI_IN_PLACE, tensor.raw_data(), count, ElementType(tensor.dtype()), mpi_op,
                        comm_, &pending->request);
    pending->keep_alive.push_back(tensor);
  }
  if (rc != MPI_SUCCESS) {
    return MpiError(CommOpName(kOp), group_->name, rc, tensor.DebugString());
  }
  Count(kOp, static_cast<int64_t>(tensor.nbytes()));
  pending->flight = RecordFlight("mpi", kOp, tensor.nbytes(), tensor.dtype(), -1);
  return pending;
}

absl::StatusOr<std::unique_ptr<MpiPendingOp>> MpiCommunicator::StartReduceScatter(
    const Tensor& input, const Tensor& output) {
  constexpr CommOp kOp = CommOp::kReduceScatter;
  NF_RETURN_IF_ERROR(internal::CheckReduceScatter(group_->name, size(), input, output));
  NF_RETURN_IF_ERROR(CheckCpu(kOp, "input", input));
  NF_RETURN_IF_ERROR(CheckCpu(kOp, "output", output));
  auto pending = NewPendingOp(kOp, output);
  const int count = static_cast<int>(output.numel());
  const void* send = input.raw_data();
  void* receive = output.raw_data();
  MPI_Datatype type = ElementType(input.dtype());
  pending->keep_alive = {input, output};
  if (ReducedInFp32(input.dtype())) {
    NF_ASSIGN_OR_RETURN(Tensor input32, Tensor::HostEmpty(DType::kF32, {input.numel()}));
    NF_ASSIGN_OR_RETURN(Tensor output32, Tensor::HostEmpty(DType::kF32, {output.numel()}));
    NF_RETURN_IF_ERROR(ops::Cast(input, input32));
    send = input32.raw_data();
    receive = output32.raw_data();
    type = MPI_FLOAT;
    pending->keep_alive.push_back(input32);
    pending->result = output32;
    pending->destination = output;
  } else if (Overlap(input, output)) {
    // MPI forbids aliased buffers (and MPI_IN_PLACE means something else here): reduce into a
    // scratch, copy on completion.
    NF_ASSIGN_OR_RETURN(Tensor scratch, Tensor::HostEmpty(output.dtype(), {output.numel()}));
    receive = scratch.raw_data();
    pending->result = scratch;
    pending->destination = output;
  }
  const int rc =
      MPI_Ireduce_scatter_block(send, receive, count, type, MPI_SUM, comm_, &pending->request);
  if (rc != MPI_SUCCESS) {
    return MpiError(CommOpName(kOp), group_->name, rc,
                    absl::StrCat(input.DebugString(), " -> ", output.DebugString()));
  }
  Count(kOp, static_cast<int64_t>(input.nbytes()));
  pending->flight = RecordFlight("mpi", kOp, input.nbytes(), input.dtype(), -1);
  return pending;
}

absl::StatusOr<std::unique_ptr<MpiPendingOp>> MpiCommunicator::StartAllGather(
    const Tensor& input, const Tensor& output) {
  constexpr CommOp kOp = CommOp::kAllGather;
  NF_RETURN_IF_ERROR(internal::CheckAllGather(group_->name, size(), input, output));
  NF_RETURN_IF_ERROR(CheckCpu(kOp, "input", input));
  NF_RETURN_IF_ERROR(CheckCpu(kOp, "output", output));
  auto pending = NewPendingOp(kOp, output);
  const int count = static_cast<int>(input.numel());
  const MPI_Datatype type = ElementType(input.dtype());
  const void* send = input.raw_data();
  pending->keep_alive = {input, output};
  const char* slot = static_cast<const char*>(output.raw_data()) + rank_ * input.nbytes();
  if (input.nbytes() > 0 && input.raw_data() == slot) {
    send = MPI_IN_PLACE;  // the input is this rank's block of the output (ZeRO's gather)
  } else if (Overlap(input, output)) {
    NF_ASSIGN_OR_RETURN(Tensor copy, Tensor::HostEmpty(input.dtype(), {input.numel()}));
    std::memcpy(copy.raw_data(), input.raw_data(), input.nbytes());
    send = copy.raw_data();
    pending->keep_alive.push_back(copy);
  }
  const int rc =
      MPI_Iallgather(send, count, type, output.raw_data(), count, type, comm_, &pending->request);
  if (rc != MPI_SUCCESS) {
    return MpiError(CommOpName(kOp), group_->name, rc,
                    absl::StrCat(input.DebugString(), " -> ", output.DebugString()));
  }
  Count(kOp, static_cast<int64_t>(output.nbytes()));
  pending->flight = RecordFlight("mpi", kOp, output.nbytes(), output.dtype(), -1);
  return pending;
}

absl::StatusOr<std::unique_ptr<MpiPendingOp>> MpiCommunicator::StartBroadcast(const Tensor& tensor,
                                                                              int root) {
  constexpr CommOp kOp = CommOp::kBroadcast;
  NF_RETURN_IF_ERROR(internal::CheckRoot(group_->name, size(), root, tensor));
  NF_RETURN_IF_ERROR(CheckCpu(kOp, "tensor", tensor));
  auto pending = NewPendingOp(kOp, tensor);
  pending->keep_alive.push_back(tensor);
  const int rc = MPI_Ibcast(tensor.raw_data(), static_cast<int>(tensor.numel()),
                            ElementType(tensor.dtype()), root, comm_, &pending->request);
  if (rc != MPI_SUCCESS) {
    return MpiError(CommOpName(kOp), group_->name, rc, tensor.DebugString());
  }
  Count(kOp, static_cast<int64_t>(tensor.nbytes()));
  pending->flight =
      RecordFlight("mpi", kOp, tensor.nbytes(), tensor.dtype(), group_->world_ranks[root]);
  return pending;
}

absl::StatusOr<std::unique_ptr<MpiPendingOp>> MpiCommunicator::StartPointToPoint(
    CommOp op, const Tensor& tensor, int peer) {
  NF_RETURN_IF_ERROR(internal::CheckPeer(op, group_->name, rank_, size(), peer, tensor));
  NF_RETURN_IF_ERROR(CheckCpu(op, "tensor", tensor));
  auto pending = NewPendingOp(op, tensor);
  pending->keep_alive.push_back(tensor);
  pending->peer_rank = peer;
  pending->peer_world_rank = group_->world_ranks[peer];
  const int count = static_cast<int>(tensor.numel());
  const MPI_Datatype type = ElementType(tensor.dtype());
  constexpr int kTag = 0;
  int rc;
  if (op == CommOp::kSend) {
    rc = MPI_Isend(tensor.raw_data(), count, type, peer, kTag, comm_, &pending->request);
  } else {
    rc = MPI_Irecv(tensor.raw_data(), count, type, peer, kTag, comm_, &pending->request);
    pending->expected_count = count;
    pending->datatype = type;
  }
  if (rc != MPI_SUCCESS) {
    return MpiError(CommOpName(op), group_->name, rc,
                    absl::StrCat(tensor.DebugString(), " with peer ", peer));
  }
  Count(op, static_cast<int64_t>(tensor.nbytes()));
  pending->flight =
      RecordFlight("mpi", op, tensor.nbytes(), tensor.dtype(), pending->peer_world_rank);
  return pending;
}

absl::StatusOr<std::unique_ptr<MpiPendingOp>> MpiCommunicator::StartBarrier() {
  auto pending = NewPendingOp(CommOp::kBarrier, Tensor());
  const int rc = MPI_Ibarrier(comm_, &pending->request);
  if (rc != MPI_SUCCESS) return MpiError("barrier", group_->name, rc, "MPI_Ibarrier");
  Count(CommOp::kBarrier, 0);
  pending->flight = RecordFlight("mpi", CommOp::kBarrier, 0, DType::kU8, -1);
  return pending;
}

absl::Status MpiCommunicator::AllReduce(const Tensor& tensor, ReduceOp op) {
  NF_ASSIGN_OR_RETURN(auto pending, StartAllReduce(tensor, op));
  return pending->Wait();
}

absl::StatusOr<std::unique_ptr<CommHandle>> MpiCommunicator::AllReduceAsync(const Tensor& tensor,
                                                                            ReduceOp op) {
  NF_ASSIGN_OR_RETURN(auto pending, StartAllReduce(tensor, op));
  return std::unique_ptr<CommHandle>(std::move(pending));
}

absl::Status MpiCommunicator::ReduceScatter(const Tensor& input, const Tensor& output) {
  NF_ASSIGN_OR_RETURN(auto pending, StartReduceScatter(input, output));
  return pending->Wait();
}

absl::Status MpiCommunicator::AllGather(const Tensor& input, const Tensor& output) {
  NF_ASSIGN_OR_RETURN(auto pending, StartAllGather(input, output));
  return pending->Wait();
}

absl::StatusOr<std::unique_ptr<CommHandle>> MpiCommunicator::ReduceScatterAsync(
    const Tensor& input, const Tensor& output) {
  NF_ASSIGN_OR_RETURN(auto pending, StartReduceScatter(input, output));
  return std::unique_ptr<CommHandle>(std::move(pending));
}

absl::StatusOr<std::unique_ptr<CommHandle>> MpiCommunicator::AllGatherAsync(const Tensor& input,
                                                                            const Tensor& output) {
  NF_ASSIGN_OR_RETURN(auto pending, StartAllGather(input, output));
  return std::unique_ptr<CommHandle>(std::move(pending));
}

absl::Status MpiCommunicator::Broadcast(const Tensor& tensor, int root) {
  NF_ASSIGN_OR_RETURN(auto pending, StartBroadcast(tensor, root));
  return pending->Wait();
}

absl::Status MpiCommunicator::Send(const Tensor& tensor, int peer) {
  NF_ASSIGN_OR_RETURN(auto pending, StartPointToPoint(CommOp::kSend, tensor, peer));
  return pending->Wait();
}

absl::Status MpiCommunicator::Recv(const Tensor& tensor, int peer) {
  NF_ASSIGN_OR_RETURN(auto pending, StartPointToPoint(CommOp::kRecv, tensor, peer));
  return pending->Wait();
}

absl::StatusOr<std::unique_ptr<CommHandle>> MpiCommunicator::SendAsync(const Tensor& tensor,
                                                                       int peer) {
  NF_ASSIGN_OR_RETURN(auto pending, StartPointToPoint(CommOp::kSend, tensor, peer));
  return std::unique_ptr<CommHandle>(std::move(pending));
}

absl::StatusOr<std::unique_ptr<CommHandle>> MpiCommunicator::RecvAsync(const Tensor& tensor,
                                                                       int peer) {
  NF_ASSIGN_OR_RETURN(auto pending, StartPointToPoint(CommOp::kRecv, tensor, peer));
  return std::unique_ptr<CommHandle>(std::move(pending));
}

absl::Status MpiCommunicator::Barrier() {
  NF_ASSIGN_OR_RETURN(auto pending, StartBarrier());
  return pending->Wait();
}

}  // namespace nf::parallel
