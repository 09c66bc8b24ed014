#include "parallel/communicator.h"

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

int64_t CommStats::total_bytes() const {
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  return total;
}

}  // namespace nf::parallel
