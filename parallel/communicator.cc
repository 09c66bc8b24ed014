#include "parallel/communicator.h"

#include "parallel/comm_checks.h"
#include "parallel/flight_recorder.h"

namespace nf::parallel {

absl::string_view CommOpName(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce:
      return "all_reduce";
    case CommOp::kReduceScatter:
      return "reduce_scatter";
    case CommOp::kAllGather:
      return "all_gather";
    case CommOp::kBroadcast:
      return "broadcast";
    case CommOp::kSend:
      return "send";
    case CommOp::kRecv:
      return "recv";
    case CommOp::kBarrier:
      return "barrier";
    case CommOp::kCount:
      break;
  }
  return "unknown";
}

void CommStats::Add(const CommStats& other) {
  for (int op = 0; op < static_cast<int>(CommOp::kCount); ++op) {
    bytes[op] += other.bytes[op];
    calls[op] += other.calls[op];
    seconds[op] += other.seconds[op];
  }
}

absl::StatusOr<std::vector<std::unique_ptr<CommHandle>>> Communicator::StartBatch(
    absl::Span<const Transfer> transfers) {
  for (const Transfer& t : transfers) {
    if (absl::Status s = internal::CheckBatchable(t.op, name()); !s.ok()) return s;
    if (absl::Status s = internal::CheckPeer(t.op, name(), rank(), size(), t.peer, t.tensor);
        !s.ok()) {
      return s;
    }
  }
  std::vector<std::unique_ptr<CommHandle>> handles;
  for (const Transfer& t : transfers) {
    auto handle = t.op == CommOp::kSend ? SendAsync(t.tensor, t.peer) : RecvAsync(t.tensor, t.peer);
    if (!handle.ok()) return handle.status();
    handles.push_back(*std::move(handle));
  }
  return handles;
}

int64_t CommStats::total_bytes() const {
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  return total;
}

uint64_t Communicator::RecordFlight(absl::string_view backend, CommOp op, int64_t bytes,
                                    DType dtype, int peer_world_rank) {
  int64_t seq = 0;
  if (op == CommOp::kSend || op == CommOp::kRecv) {
    seq = ++flight_transfers_[2 * int64_t{peer_world_rank} + (op == CommOp::kSend ? 1 : 0)];
  } else {
    seq = ++flight_collectives_;
  }
  return FlightRecorder::Get().Issued(name(), backend, seq, op, peer_world_rank, bytes, dtype);
}

}  // namespace nf::parallel
