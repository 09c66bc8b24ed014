// MpiCommunicator: the Communicator of a group of MPI processes, for CPU tensors. It owns its
// MPI communicator (a duplicate of the one it was made from, or the result of a split), so
// its traffic never matches anyone else's messages, and MPI errors come back as statuses
// (MPI_ERRORS_RETURN) instead of killing the process.
//
// Every blocking call is the non-blocking MPI call (MPI_Iallreduce, MPI_Isend, MPI_Ibarrier,
// ...) plus a wait under the watchdog (watchdog.h), so a rank whose peers never arrive aborts
// the job with a report after options.watchdog.timeout instead of hanging. Async calls return
// a handle whose Wait() runs under the same watchdog; the handle keeps the tensors (and any
// scratch) alive until then, and a handle destroyed without Wait() waits in its destructor.
//
// fp16/bf16 reductions (AllReduce, ReduceScatter) convert to an fp32 scratch, reduce in fp32
// and round once into the tensor, as the interface promises; other dtypes reduce natively.
// Point-to-point messages match in program order (one tag), so a pipeline's sends and receives
// between two ranks pair up in the order both sides issue them.
//
// Counts are MPI ints: a tensor of 2^31 elements or more is refused (the CPU path carries
// tests and small runs; GPU tensors go through NCCL).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "parallel/communicator.h"
#include "parallel/watchdog.h"

namespace nf::parallel {

class MpiPendingOp;

class MpiCommunicator final : public Communicator {
 public:
  struct Options {
    WatchdogOptions watchdog;
  };

  // A communicator over all ranks of the job, named "world" (a duplicate of MPI_COMM_WORLD).
  // Initialises MPI (InitMpi) when needed. Collective over the world.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> World(Options options = {});
  // A communicator over the ranks of `comm` (duplicated: the caller keeps and frees `comm`).
  // Collective over `comm`.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Duplicate(MPI_Comm comm, std::string name,
                                                                    Options options = {});

  // Passed as Split's color by ranks that join no group.
  static constexpr int kNoGroup = -1;
  // The ranks of this group passing the same color (>= 0) form a new group, ordered by key
  // (MPI_Comm_split); a rank passing kNoGroup gets nullptr. Collective over this group; a
  // barrier under the watchdog comes first, so a rank that never arrives is reported instead
  // of hanging every other rank in MPI_Comm_split. The new group has this one's options.
  absl::StatusOr<std::unique_ptr<MpiCommunicator>> Split(int color, int key,
                                                         std::string name) const;

  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_->world_ranks.size()); }
  const std::string& name() const override { return group_->name; }

  absl::Status AllReduce(const Tensor& tensor, ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<CommHandle>> AllReduceAsync(const Tensor& tensor,
                                                             ReduceOp op) override;
  absl::Status ReduceScatter(const Tensor& input, const Tensor& output) override;
  absl::StatusOr<std::unique_ptr<CommHandle>> ReduceScatterAsync(const Tensor& input,
                                                                 const Tensor& output) override;
  absl::Status AllGather(const Tensor& input, const Tensor& output) override;
  absl::StatusOr<std::unique_ptr<CommHandle>> AllGatherAsync(const Tensor& input,
                                                             const Tensor& output) override;
  absl::Status Broadcast(const Tensor& tensor, int root) override;
  absl::Status Send(const Tensor& tensor, int peer) override;
  absl::Status Recv(const Tensor& tensor, int peer) override;
  absl::StatusOr<std::unique_ptr<CommHandle>> SendAsync(const Tensor& tensor, int peer) override;
  absl::StatusOr<std::unique_ptr<CommHandle>> RecvAsync(const Tensor& tensor, int peer) override;
  absl::Status Barrier() override;

  // For building other communicators over the same ranks (the NCCL communicator's unique id
  // and its agreement that every rank could set up its device): collective over this group,
  // waited for under the watchdog, and not counted in stats(), which hold the training's
  // traffic only.
  // `bytes` of `root` to every rank.
  absl::Status BroadcastBytes(absl::Span<uint8_t> bytes, int root) const;
  // The largest `value` over the ranks.
  absl::StatusOr<int> MaxOverGroup(int value) const;

  MPI_Comm comm() const { return comm_; }
  // The world rank of each member, by rank in this group.
  const std::vector<int>& world_ranks() const { return group_->world_ranks; }
  const Options& options() const { return options_; }

  // What the watchdog reports about a group; shared with the handles of async calls, which
  // may outlive the communicator.
  struct GroupInfo {
    std::string name;
    std::vector<int> world_ranks;  // by group rank
    std::vector<int> others;       // world_ranks without this rank
  };

 private:
  MpiCommunicator(MPI_Comm comm, std::shared_ptr<const GroupInfo> group, int rank, Options options)
      : comm_(comm), group_(std::move(group)), rank_(rank), options_(options) {}
  // Takes ownership of `comm`.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Adopt(MPI_Comm comm, std::string name,
                                                                Options options);

  absl::Status CheckCpu(CommOp op, absl::string_view role, const Tensor& tensor) const;
  // A pending `op` on `tensor` (shown in its errors) that adds its wait to stats().
  std::unique_ptr<MpiPendingOp> NewPendingOp(CommOp op, const Tensor& tensor) const;
  absl::StatusOr<std::unique_ptr<MpiPendingOp>> StartAllReduce(const Tensor& tensor, ReduceOp op);
  absl::StatusOr<std::unique_ptr<MpiPendingOp>> StartReduceScatter(const Tensor& input,
                                                                   const Tensor& output);
  absl::StatusOr<std::unique_ptr<MpiPendingOp>> StartAllGather(const Tensor& input,
                                                               const Tensor& output);
  absl::StatusOr<std::unique_ptr<MpiPendingOp>> StartBroadcast(const Tensor& tensor, int root);
  absl::StatusOr<std::unique_ptr<MpiPendingOp>> StartPointToPoint(CommOp op, const Tensor& tensor,
                                                                  int peer);
  absl::StatusOr<std::unique_ptr<MpiPendingOp>> StartBarrier();

  MPI_Comm comm_;
  std::shared_ptr<const GroupInfo> group_;
  int rank_;
  Options options_;
};

}  // namespace nf::parallel
