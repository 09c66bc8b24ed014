// What a group's links cost: latency and bandwidth of all-reduce and of send/recv between its
// first two members, measured on the group's own communicator, so that nf-bench-layout can show
// next to a layout's traffic by group what each group's path (shared memory, a node's loopback,
// the network between nodes) delivers.
#pragma once

#include "absl/status/statusor.h"
#include "parallel/communicator.h"

namespace nf::bench {

struct LinkFigures {
  double all_reduce_small_us;    // 8 bytes, median per call
  double all_reduce_bus_gbytes;  // 4 MiB: 2 (n - 1) / n x bytes / time (NCCL's bus bandwidth)
  double send_recv_small_us;     // 8 bytes one way: half a round trip, median
  double send_recv_gbytes;       // 4 MiB one way
};

// Collective over `group` (size >= 2): every member calls it. The figures are group rank 0's
// (ranks other than the first two take part in the all-reduces only).
absl::StatusOr<LinkFigures> MeasureGroupLinks(parallel::Communicator& group);

}  // namespace nf::bench
