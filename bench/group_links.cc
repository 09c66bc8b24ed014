#include "bench/group_links.h"

#include <chrono>
#include <vector>

#include "bench/statistics.h"
#include "core/status.h"
#include "core/tensor.h"

namespace nf::bench {
namespace {

constexpr int64_t kSmallFloats = 2;        // 8 bytes
constexpr int64_t kLargeFloats = 1 << 20;  // 4 MiB
constexpr int kSmallCalls = 50, kLargeCalls = 10, kWarmup = 3;

// Median seconds of `calls` calls of `op`, after kWarmup untimed ones.
template <typename Op>
absl::StatusOr<double> MedianSeconds(int calls, Op&& op) {
  std::vector<double> seconds;
  for (int i = 0; i < kWarmup + calls; ++i) {
    const auto start = std::chrono::steady_clock::now();
    NF_RETURN_IF_ERROR(op());
    if (i >= kWarmup) seconds.push_back(Seconds(start));
  }
  return Median(seconds);
}

// One round trip between group ranks 0 and 1 (0 sends first); nothing on the other ranks.
absl::Status RoundTrip(parallel::Communicator& group, const Tensor& tensor) {
  if (group.rank() == 0) {
    NF_RETURN_IF_ERROR(group.Send(tensor, 1));
    return group.Recv(tensor, 1);
  }
  if (group.rank() == 1) {
    NF_RETURN_IF_ERROR(group.Recv(tensor, 0));
    return group.Send(tensor, 0);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LinkFigures> MeasureGroupLinks(parallel::Communicator& group) {
  NF_ASSIGN_OR_RETURN(const Tensor small, Tensor::HostZeros(DType::kF32, {kSmallFloats}));
  NF_ASSIGN_OR_RETURN(const Tensor large, Tensor::HostZeros(DType::kF32, {kLargeFloats}));
  const auto all_reduce = [&](const Tensor& t) {
    return [&group, &t] { return group.AllReduce(t, parallel::ReduceOp::kSum); };
  };
  const auto round_trip = [&](const Tensor& t) {
    return [&group, &t] { return RoundTrip(group, t); };
  };
  NF_ASSIGN_OR_RETURN(const double reduce_small, MedianSeconds(kSmallCalls, all_reduce(small)));
  NF_ASSIGN_OR_RETURN(const double reduce_large, MedianSeconds(kLargeCalls, all_reduce(large)));
  NF_ASSIGN_OR_RETURN(const double trip_small, MedianSeconds(kSmallCalls, round_trip(small)));
  NF_ASSIGN_OR_RETURN(const double trip_large, MedianSeconds(kLargeCalls, round_trip(large)));
  NF_RETURN_IF_ERROR(group.Barrier());
  const double n = group.size();
  const double large_bytes = 4.0 * kLargeFloats;
  return LinkFigures{.all_reduce_small_us = 1e6 * reduce_small,
                     .all_reduce_bus_gbytes = 2 * (n - 1) / n * large_bytes / reduce_large / 1e9,
                     .send_recv_small_us = 1e6 * trip_small / 2,
                     .send_recv_gbytes = large_bytes / (trip_large / 2) / 1e9};
}

}  // namespace nf::bench
