// NcclCommunicator: the Communicator of a group of ranks for tensors on one CUDA device each,
// over NCCL. Built only with the CUDA backend (NF_WITH_CUDA). It is made from the
// MpiCommunicator of the same ranks, which carries the NCCL unique id and names the group.
//
// Streams. NCCL works on the communicator's own stream (non-blocking with respect to the
// legacy default stream, at the device's greatest stream priority so that an overlapped
// collective is not queued behind the compute stream's kernels). Every call first makes that stream
// wait for everything issued so far on the compute stream given to Create (an event), so a
// collective reads what the kernels before it wrote. Waiting for an operation (a blocking call, or
// Wait() on an async call's handle) makes the compute stream wait for it (an event on the
// communication stream) and returns: the host goes on queueing kernels behind the collective and
// blocks only where it reads a value back (ops::OnHost, which synchronises the compute stream).
// Barrier alone also waits on the host, as its meaning is that every rank has reached it.
//
// The watchdog. No host call waits for a collective, so each communicator has an AsyncWatchdog
// (async_watchdog.h) whose thread polls every issued operation's completion event and
// ncclCommGetAsyncError. An operation that outlives the deadline, or an asynchronous NCCL error
// (a peer's process died, a network error), gets the report line, ncclCommAbort (which stops
// the kernels still waiting for absent peers) and the end of the job (docs/design.md section 5);
// a host blocked meanwhile in a read of a value that never comes is ended with it. The host calls
// that NCCL itself blocks in, ncclCommInitRank (until every rank joined) and ncclGroupEnd (which
// connects lazily to a peer the first time a group talks to it), are watched the same way from
// their start, so a peer that died or never came before its first transfer is reported too.
// Once the watchdog gives up, the communicator is aborting: no NCCL call starts any more, and a
// call that finds it so, or fails meanwhile, parks its thread until the watchdog has ended the
// job (exit 134) instead of returning an error that would end it first with exit 1. The time of
// an operation reaches the stats once it has completed (stats() adds those completed so far, and
// so does every Wait(), which keeps the list of operations not yet added bounded).

// Precision. f32, f64, i32 and i64 reduce natively. fp16 and bf16 are reduced by NCCL in their
// own precision, rounded at every hop of its ring or tree: unlike the MPI communicator (fp32,
// one rounding), a sum over more than two ranks can lose the small contributions a single
// rounding would keep, and its last bits can depend on NCCL's algorithm and the rank order. The
// tests use values whose sums are exact in every precision, so they do not measure this. Data
// movement (all-gather, broadcast, send, recv) copies bytes and takes every dtype.
//
// In place. AllReduce and Broadcast work in place. ReduceScatter's output may be this rank's
// block of its input, and AllGather's input this rank's block of its output (NCCL's in-place
// forms, ZeRO's gather); any other overlap of input and output is refused, where the MPI
// communicator goes through a scratch copy.
//
// Point to point. Every call is issued at once as one NCCL group (ncclGroupStart/End) on the
// communication stream, ordered after the compute stream by an event: SendAsync and RecvAsync
// a group of one, StartBatch a group of all its transfers. There is no other grouping policy
// here, so what the tests run on NCCL's rules (tests/parallel/nccl_rules_communicator.h) is
// what runs on GPUs. The rules that matter: NCCL serialises every kernel of a communicator,
// whatever stream it is given, and a send larger than its buffers completes only once the
// peer's receive runs, so a send issued alone blocks everything this rank issues after it
// until the peer receives; two ranks that each send alone before receiving never finish. The
// pipeline executor therefore issues each step's transfers as one batch, arranged by
// transfer_plan.h so that no rank's group waits for a group another rank issues later.
// Messages to one peer match in issue order, within a group as across groups. NCCL does not
// check that both sides agree on the size: a receive of another size than the send is a
// programming error that the MPI communicator and the test double report and NCCL does not.
// Sending to this rank is refused, as by every communicator.
//
// A communicator is used by one thread at a time (communicator.h); handles may outlive it.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/async_watchdog.h"
#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"
#include "parallel/nccl_plan.h"
#include "parallel/watchdog.h"

namespace nf::parallel {

class NcclPendingOp;

struct NcclCommunicatorOptions {
  WatchdogOptions watchdog;
  // The watchdog's end (async_watchdog.h), replaceable by tests that observe it instead of
  // ending the process; unset, the defaults.
  std::function<void(const std::string& report)> report = nullptr;
  std::function<void(int exit_code)> end_job = nullptr;
  absl::Duration abort_grace = kDefaultAbortGrace;
  std::function<void(int exit_code, const std::string& line)> hard_exit = nullptr;
};

class NcclCommunicator final : public Communicator {
 public:
  using Options = NcclCommunicatorOptions;

  // A communicator over the ranks of `group`, with its name and rank order, moving tensors on
  // CUDA device `device` and ordered after `compute_stream` (a stream of that device; nullptr is
  // the legacy default stream). Collective over `group`: the ranks first agree, under the
  // watchdog, that each could set up its device and that rank 0 made the NCCL id, so a rank
  // that fails there makes every rank return an error. ncclCommInitRank itself then blocks
  // inside NCCL until every rank has joined.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(const MpiCommunicator& group,
                                                                  int device,
                                                                  cudaStream_t compute_stream,
                                                                  Options options = {});

  // A group's members as NCCL needs them: its name, the world rank of each member by group
  // rank, and this rank.
  struct Members {
    std::string name;
    std::vector<int> world_ranks;
    int rank = 0;
  };
  // What Create does once its ranks have agreed over MPI: a communicator joining the NCCL
  // communicator of `id` (made by one member's ncclGetUniqueId and handed to the others by
  // other means) as rank members.rank. For callers without MPI, such as the lent-GPU check's
  // test that runs two ranks as two threads of one process, one GPU each
  // (tests/gpu/nccl_threads_test.cc). Blocks inside ncclCommInitRank until every rank joined:
  // each rank must call it from its own thread.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateWithId(Members members,
                                                                        const ncclUniqueId& id,
                                                                        int device,
                                                                        cudaStream_t compute_stream,
                                                                        Options options = {});

  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  const std::string& name() const override;

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
  // One NCCL group of the batch's sends and receives.
  absl::StatusOr<std::vector<std::unique_ptr<CommHandle>>> StartBatch(
      absl::Span<const Transfer> transfers) override;
  // An all-reduce of one int on the device: returns when every rank has reached it.
  absl::Status Barrier() override;

  int device() const;
  cudaStream_t compute_stream() const;
  cudaStream_t comm_stream() const;
  // The world rank of each member, by rank in this group.
  const std::vector<int>& world_ranks() const;
  // Operations waited for whose time is not yet in the stats: those still running at their
  // Wait() or since, never more than SettlingQueue's capacity (settling_queue.h), whether or
  // not anyone reads stats(). For tests.
  size_t unsettled_operations() const;

  // The NCCL communicator, streams and group description; shared with the handles of async
  // calls, which may outlive the communicator.
  struct State;

 private:
  explicit NcclCommunicator(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // The state of a communicator over `members`, before its device is prepared.
  static std::shared_ptr<State> NewState(Members members, int device, cudaStream_t compute_stream,
                                         const Options& options);
  // ncclCommInitRank on `id`, then the watchdog: the communicator, ready.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Join(std::shared_ptr<State> state,
                                                                const ncclUniqueId& id);

  internal::NcclCaller Caller() const;

  // One operation to start: its arguments, or why it cannot start, and the tensors that stay
  // alive until it is waited for.
  struct Planned {
    CommOp op;
    absl::StatusOr<internal::NcclPlan> plan;
    std::vector<Tensor> tensors;
  };
  // Issues `ops`, ordered after the compute stream as of this call, as one NCCL group on the
  // communication stream; nothing is issued unless every plan is valid.
  absl::StatusOr<std::vector<std::unique_ptr<NcclPendingOp>>> StartGroup(
      absl::Span<const Planned> ops);
  // StartGroup of one operation.
  absl::StatusOr<std::unique_ptr<NcclPendingOp>> Start(
      CommOp op, const absl::StatusOr<internal::NcclPlan>& plan, std::vector<Tensor> tensors);

  // Adds the time of the operations completed since the last call to the stats.
  void SettleStats() const override;

  std::shared_ptr<State> state_;
};

}  // namespace nf::parallel
