// A Communicator with NCCL's rules instead of MPI's, for tests on the CPU: the ranks of a group
// are threads of one process sharing an NcclRulesFabric, and the real code above the
// Communicator interface (the pipeline executor, the layers) runs on it unchanged. NCCL itself
// cannot run two ranks on one GPU, and no test machine has two, so this is where multi-GPU
// communication is checked.
//
// The rules, as NCCL applies them to one communicator:
//   - Every call is one group: a StartBatch one group of its transfers (ncclGroupStart/End),
//     any other call a group of its own, exactly as NcclCommunicator issues them. A rank's
//     groups run strictly in issue order: a group starts only when every group issued before
//     it on that rank has completed.
//   - A send of more than `eager_bytes` completes only when its receive's group has started on
//     the peer (NCCL's internal buffers hold no more; a 2.7B activation is far beyond them); a
//     send of at most `eager_bytes` completes when its own group starts. A receive completes
//     when its send's group has started. Messages to one peer match in issue order.
//   - A group completes when all of its operations have; Wait() on any of its handles returns
//     then (the host waits as the compute stream would on the GPU).
//   - A collective completes when the same collective has started on every rank. The k-th
//     collective of every rank must be the same operation (kind, dtype, shape, root,
//     reduction): a call that differs fails, naming both operations, and so does every wait.
// And what NCCL leaves undefined is an error here: a send's buffer changed between the call
// and its Wait() (the GPU reads it in between), and a receive of another size than its send.
//
// Deadlock. Nothing here times out. When every rank's thread is waiting (or has finished) and
// no group can progress, every waiting call returns FailedPrecondition: "deadlock under NCCL's
// rules: rank 0 waits for <its operation>, its communicator runs <group> whose send to rank 1
// waits for rank 1 to start the receive; ...". A rank's thread is finished once its
// communicator is destroyed.
//
// Reductions are computed in double and rounded once to the tensor's dtype (NCCL rounds fp16
// and bf16 at every hop; tests use values whose sums are exact). Tensors may be on any device
// whose memory the host can read (the tests' fake devices).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace nf::testing {

class NcclRulesCommunicator;

class NcclRulesFabric {
 public:
  struct Options {
    // Sends of at most this many bytes complete without their receive (0: none does).
    int64_t eager_bytes = 0;
  };
  explicit NcclRulesFabric(int size);
  NcclRulesFabric(int size, Options options);
  ~NcclRulesFabric();

  int size() const;
  // The communicator of `rank`, named `name` in errors; one per rank, used by one thread.
  std::unique_ptr<NcclRulesCommunicator> Join(int rank, std::string name = "pp");

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

class NcclRulesCommunicator final : public parallel::Communicator {
 public:
  NcclRulesCommunicator(std::shared_ptr<NcclRulesFabric::Impl> fabric, int rank, std::string name);
  // Marks this rank's thread finished: its groups still run, it issues and waits no more.
  ~NcclRulesCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override;
  const std::string& name() const override { return name_; }

  absl::Status AllReduce(const Tensor& tensor, parallel::ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> AllReduceAsync(
      const Tensor& tensor, parallel::ReduceOp op) override;
  absl::Status ReduceScatter(const Tensor& input, const Tensor& output) override;
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> ReduceScatterAsync(
      const Tensor& input, const Tensor& output) override;
  absl::Status AllGather(const Tensor& input, const Tensor& output) override;
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> AllGatherAsync(
      const Tensor& input, const Tensor& output) override;
  absl::Status Broadcast(const Tensor& tensor, int root) override;
  absl::Status Send(const Tensor& tensor, int peer) override;
  absl::Status Recv(const Tensor& tensor, int peer) override;
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> SendAsync(const Tensor& tensor,
                                                                  int peer) override;
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> RecvAsync(const Tensor& tensor,
                                                                  int peer) override;
  absl::StatusOr<std::vector<std::unique_ptr<parallel::CommHandle>>> StartBatch(
      absl::Span<const parallel::Transfer> transfers) override;
  absl::Status Barrier() override;

  struct Call;  // one operation's arguments

 private:
  absl::StatusOr<std::vector<std::unique_ptr<parallel::CommHandle>>> Issue(std::vector<Call> calls);
  absl::StatusOr<std::unique_ptr<parallel::CommHandle>> IssueOne(Call call);

  std::shared_ptr<NcclRulesFabric::Impl> fabric_;
  int rank_;
  std::string name_;
};

}  // namespace nf::testing
