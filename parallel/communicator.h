// Collective and point-to-point communication within one group of ranks (a tensor-, data- or
// pipeline-parallel group, or the world), behind one interface with three implementations:
// MPI for CPU tensors (mpi_communicator.h), NCCL for GPU tensors (with the CUDA backend), and a
// group of one (local_communicator.h) where every collective is the identity.
//
// Every call counts the bytes it moves, by operation, so the volume of a step can be checked
// against the formulas of the layers and exported as metrics. The count is the payload of the
// call on this rank, whatever the algorithm puts on the wire and whatever the group's size
// (a group of one counts the same as a group of eight, so a layer's formula holds at any tp):
//   AllReduce, Broadcast, Send, Recv   tensor.nbytes()
//   ReduceScatter                      input.nbytes()
//   AllGather                          output.nbytes()
//   Barrier                            0 (the call is counted)
// A call counts once it has been validated and started (an async call when issued, not at
// Wait); a call refused with an error counts nothing. fp16/bf16 reductions count their own
// size, not the fp32 they are reduced in.
//
// Every call also adds the seconds this rank waited for it to complete, by operation: the time
// between the operation being able to start (its inputs ready) and its completion, which is
// the transfer plus any wait for late peers; the latter dominates with stragglers or pipeline
// bubbles. With MPI it is the host's time inside Wait() (a blocking call waits at once; an
// async one only for what it had not finished while the caller computed: the exposed part).
// With NCCL it is the communication stream's time from the op's start to its end, measured
// by CUDA events, an NCCL group's time shared evenly among its operations. A group of one
// never waits.
//
// Every operation runs under the collective watchdog (watchdog.h, async_watchdog.h): one that
// does not complete within its deadline reports which operation, group and peers it waited
// for, then aborts the whole job. A communicator is used by one thread at a time, and every rank of
// a group issues the group's collectives in the same order.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/tensor.h"

namespace nf::parallel {

enum class ReduceOp { kSum, kMax };

enum class CommOp : int {
  kAllReduce = 0,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kSend,
  kRecv,
  kBarrier,
  kCount,
};
absl::string_view CommOpName(CommOp op);  // "all_reduce", "reduce_scatter", ...

// Bytes, calls and seconds waited by operation, since the communicator was created (or last
// reset).
struct CommStats {
  std::array<int64_t, static_cast<int>(CommOp::kCount)> bytes{};
  std::array<int64_t, static_cast<int>(CommOp::kCount)> calls{};
  std::array<double, static_cast<int>(CommOp::kCount)> seconds{};
  int64_t total_bytes() const;
  void Add(const CommStats& other);  // element-wise sum
  double seconds_of(CommOp op) const { return seconds[static_cast<int>(op)]; }
};

// One send or receive of a batch (Communicator::StartBatch).
struct Transfer {
  CommOp op = CommOp::kSend;  // kSend or kRecv
  Tensor tensor;
  int peer = -1;
};

// A pending non-blocking operation; Wait() must be called exactly once before the tensors
// involved are reused. With MPI (CPU tensors) it completes the operation under the watchdog;
// with NCCL it orders the compute stream's later kernels after the operation and returns
// (nccl_communicator.h), which is all a consumer on the device needs.
class CommHandle {
 public:
  virtual ~CommHandle() = default;
  virtual absl::Status Wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // within this group
  virtual int size() const = 0;
  // "tp", "dp", "pp", "mp", "embedding" or "world": names the group in errors and metrics.
  virtual const std::string& name() const = 0;

  // In place over all ranks of the group: tensor = op over the ranks' tensors (f32, f64,
  // f16, bf16, i32, i64; f16/bf16 are reduced in fp32 and rounded once, except by NCCL, which
  // rounds at every hop: nccl_communicator.h).
  virtual absl::Status AllReduce(const Tensor& tensor, ReduceOp op) = 0;
  virtual absl::StatusOr<std::unique_ptr<CommHandle>> AllReduceAsync(const Tensor& tensor,
                                                                     ReduceOp op) = 0;
  // output [n / size] = sum over ranks of input's slice [rank * n / size, (rank + 1) n / size).
  virtual absl::Status ReduceScatter(const Tensor& input, const Tensor& output) = 0;
  virtual absl::StatusOr<std::unique_ptr<CommHandle>> ReduceScatterAsync(const Tensor& input,
                                                                         const Tensor& output) = 0;
  // output [size * n] = the ranks' inputs [n], in rank order. The input may be this rank's
  // block of the output (ZeRO's parameter gather).
  virtual absl::Status AllGather(const Tensor& input, const Tensor& output) = 0;
  virtual absl::StatusOr<std::unique_ptr<CommHandle>> AllGatherAsync(const Tensor& input,
                                                                     const Tensor& output) = 0;
  virtual absl::Status Broadcast(const Tensor& tensor, int root) = 0;
  virtual absl::Status Send(const Tensor& tensor, int peer) = 0;
  virtual absl::Status Recv(const Tensor& tensor, int peer) = 0;
  virtual absl::StatusOr<std::unique_ptr<CommHandle>> SendAsync(const Tensor& tensor, int peer) = 0;
  virtual absl::StatusOr<std::unique_ptr<CommHandle>> RecvAsync(const Tensor& tensor, int peer) = 0;
  virtual absl::Status Barrier() = 0;
  // Starts `transfers` (sends and receives, to any peers) as one unit and returns a handle for
  // each, in order; messages to one peer match in the order of the calls and of the batch.
  // NCCL runs a batch as one group, whose transfers progress together: this is how two ranks
  // exchange messages without waiting for each other (transfer_plan.h). By default, as for MPI,
  // each transfer starts on its own (SendAsync, RecvAsync): non-blocking operations that never
  // wait for each other. Nothing starts unless every transfer is a send or receive to a peer
  // of the group.
  virtual absl::StatusOr<std::vector<std::unique_ptr<CommHandle>>> StartBatch(
      absl::Span<const Transfer> transfers);

  // Bytes, calls and seconds so far, with the time of every operation completed by now.
  const CommStats& stats() const {
    SettleStats();
    return *stats_;
  }
  // Starts counting afresh; operations completing later count in the new period.
  void ResetStats() {
    SettleStats();
    *stats_ = {};
  }

 protected:
  // A communicator whose operations complete after Wait() returned (NCCL's) adds their time
  // here; the others add it in Wait().
  virtual void SettleStats() const {}

  void Count(CommOp op, int64_t bytes) {
    stats_->bytes[static_cast<int>(op)] += bytes;
    ++stats_->calls[static_cast<int>(op)];
  }
  // Records an operation in the flight recorder (flight_recorder.h) as issued and returns its
  // id, for FlightRecorder::Waiting and Completed. It is numbered so that operations that must
  // meet have the same number on their ranks: collectives 1, 2, ... among this communicator's
  // collectives; sends and receives per peer (a rank's k-th receive from a peer meets that
  // peer's k-th send to it). `peer_world_rank`: a send's or receive's peer, a broadcast's root,
  // else -1.
  uint64_t RecordFlight(absl::string_view backend, CommOp op, int64_t bytes, DType dtype,
                        int peer_world_rank);
  // For the handles of pending operations, which add their wait at completion: shared, so a
  // handle completed after its communicator is gone writes to live memory.
  const std::shared_ptr<CommStats>& shared_stats() const { return stats_; }

 private:
  std::shared_ptr<CommStats> stats_ = std::make_shared<CommStats>();
  int64_t flight_collectives_ = 0;  // collectives recorded so far
  // Sends (key 2 x peer + 1) and receives (2 x peer) recorded so far, by peer world rank.
  std::map<int64_t, int64_t> flight_transfers_;
};

}  // namespace nf::parallel
