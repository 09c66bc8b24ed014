// The communicator of a group of one: rank 0 of 1. Every collective is the identity (AllGather
// and ReduceScatter copy input to output), Send and Recv are errors since there is no peer.
// Calls are validated and counted exactly as MpiCommunicator validates and counts them, so a
// single-rank run refuses what a multi-rank run would refuse and reports the same volume.
//
// AllReduce, Broadcast and Barrier touch no memory and take tensors on any device; the copies
// of AllGather and ReduceScatter take CPU tensors of any dtype and device tensors of a floating
// dtype (copied by the device's backend).
#pragma once

#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace nf::parallel {

class LocalCommunicator final : public Communicator {
 public:
  // `name` names the group in errors and metrics ("tp", "dp", ...).
  explicit LocalCommunicator(std::string name = "world") : name_(std::move(name)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

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

 private:
  absl::Status Copy(CommOp op, const Tensor& input, const Tensor& output);

  std::string name_;
};

}  // namespace nf::parallel
