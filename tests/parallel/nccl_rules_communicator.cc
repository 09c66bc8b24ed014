#include "parallel/nccl_rules_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm_test_util.h"
#include "core/status.h"
#include "parallel/comm_checks.h"

namespace nf::testing {

using parallel::CommOp;
using parallel::ReduceOp;

// ---- The fabric's state -------------------------------------------------------------------------

struct NcclRulesCommunicator::Call {
  CommOp op = CommOp::kSend;
  Tensor tensor;  // send: source; recv: destination; collectives: input (in place: in and out)
  Tensor output;  // all-gather and reduce-scatter
  int peer = -1;  // send/recv: the other rank; broadcast: the root
  ReduceOp reduce = ReduceOp::kSum;
};

struct Op {
  NcclRulesCommunicator::Call call;
  int rank = 0;
  size_t index = 0;  // send/recv: place in its channel; collective: its sequence number
  std::string describe;
  std::vector<uint8_t> snapshot;  // a send's bytes at the call
  bool started = false;           // its group has started
  bool done = false;              // this operation has completed ...
  bool group_done = false;        // ... and so has its group: Wait() returns
  absl::Status status;
};

struct Group {
  std::vector<std::shared_ptr<Op>> ops;
  bool started = false;
  std::string Describe() const {
    return absl::StrCat(
        ops.size() > 1 ? "group [" : "[",
        absl::StrJoin(ops, ", ",
                      [](std::string* out, const auto& op) { absl::StrAppend(out, op->describe); }),
        "]");
  }
};

struct NcclRulesFabric::Impl {
  Impl(int size, Options options)
      : size(size), options(options), ranks(size), channels(static_cast<size_t>(size) * size) {}

  struct RankState {
    std::deque<std::shared_ptr<Group>> queue;      // issued, not completed; front runs
    std::vector<std::shared_ptr<Op>> collectives;  // every collective issued, in order
    bool finished = false;
    const Op* waiting_on = nullptr;  // what its thread waits for, if it does
  };
  struct Channel {
    std::vector<std::shared_ptr<Op>> sends, recvs;  // in issue order
  };

  Channel& ChannelOf(int from, int to) { return channels[static_cast<size_t>(from) * size + to]; }

  // Moves every group as far as the rules allow; returns whether anything changed.
  bool Progress();
  // Completes a send and its receive: the receive gets the bytes the send had at its call.
  void Deliver(Op& send, Op& recv);
  // Completes the index-th collective on every rank once all of them have started.
  bool TryCollective(size_t index);
  // Sets `deadlock` when every thread waits for something that cannot happen, or has finished.
  void CheckDeadlock();
  std::string DescribeStuck(int rank) const;

  const int size;
  const Options options;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<RankState> ranks;
  std::vector<Channel> channels;
  std::string deadlock;  // set once, then every wait fails with it
  absl::Status fatal;    // a mismatched collective: every wait fails with it
};

void NcclRulesFabric::Impl::Deliver(Op& send, Op& recv) {
  if (send.call.tensor.nbytes() != recv.call.tensor.nbytes()) {
    const absl::Status mismatch = absl::InvalidArgumentError(
        absl::StrCat("rank ", recv.rank, "'s ", recv.describe, " does not match rank ", send.rank,
                     "'s ", send.describe, " (NCCL would not notice)"));
    send.status = recv.status = mismatch;
  } else {
    std::memcpy(recv.call.tensor.raw_data(), send.snapshot.data(), send.snapshot.size());
  }
  send.done = recv.done = true;
}

bool NcclRulesFabric::Impl::TryCollective(size_t index) {
  std::vector<Op*> ops;
  for (RankState& r : ranks) {
    if (r.collectives.size() <= index || !r.collectives[index]->started) return false;
    ops.push_back(r.collectives[index].get());
  }
  if (ops.front()->done) return false;
  const CommOp kind = ops.front()->call.op;
  if (kind == CommOp::kAllReduce) {
    std::vector<double> reduced = Values(ops[0]->call.tensor);
    for (size_t r = 1; r < ops.size(); ++r) {
      const std::vector<double> values = Values(ops[r]->call.tensor);
      for (size_t i = 0; i < reduced.size(); ++i) {
        reduced[i] = ops[0]->call.reduce == ReduceOp::kSum ? reduced[i] + values[i]
                                                           : std::max(reduced[i], values[i]);
      }
    }
    for (Op* op : ops) SetValues(op->call.tensor, reduced);
  } else if (kind == CommOp::kBroadcast) {
    const Op& root = *ops[ops.front()->call.peer];
    const std::vector<uint8_t> bytes(
        static_cast<const uint8_t*>(root.call.tensor.raw_data()),
        static_cast<const uint8_t*>(root.call.tensor.raw_data()) + root.call.tensor.nbytes());
    for (Op* op : ops) std::memcpy(op->call.tensor.raw_data(), bytes.data(), bytes.size());
  } else if (kind == CommOp::kAllGather) {
    // Inputs first: an input may be its rank's block of an output.
    std::vector<uint8_t> gathered;
    for (Op* op : ops) {
      const auto* in = static_cast<const uint8_t*>(op->call.tensor.raw_data());
      gathered.insert(gathered.end(), in, in + op->call.tensor.nbytes());
    }
    for (Op* op : ops) std::memcpy(op->call.output.raw_data(), gathered.data(), gathered.size());
  } else if (kind == CommOp::kReduceScatter) {
    const size_t n = static_cast<size_t>(ops.front()->call.output.numel());
    std::vector<double> sums(n * ops.size(), 0.0);
    for (Op* op : ops) {
      const std::vector<double> values = Values(op->call.tensor);
      for (size_t i = 0; i < sums.size(); ++i) sums[i] += values[i];
    }
    for (size_t r = 0; r < ops.size(); ++r) {
      SetValues(ops[r]->call.output,
                std::vector<double>(sums.begin() + r * n, sums.begin() + (r + 1) * n));
    }
  }
  for (Op* op : ops) op->done = true;
  return true;
}

bool NcclRulesFabric::Impl::Progress() {
  bool any = false;
  for (bool changed = true; changed;) {
    changed = false;
    for (int r = 0; r < size; ++r) {
      std::deque<std::shared_ptr<Group>>& queue = ranks[r].queue;
      while (!queue.empty()) {
        Group& group = *queue.front();
        if (!group.started) {
          group.started = true;
          changed = true;
          for (const auto& op : group.ops) {
            op->started = true;
            if (op->call.op == CommOp::kSend &&
                static_cast<int64_t>(op->call.tensor.nbytes()) <= options.eager_bytes) {
              op->done = true;  // in NCCL's buffers; its receive copies from the snapshot
            }
          }
        }
        for (const auto& op : group.ops) {
          const CommOp kind = op->call.op;
          if (kind == CommOp::kSend) {
            Channel& channel = ChannelOf(r, op->call.peer);
            if (channel.recvs.size() > op->index) {
              Op& recv = *channel.recvs[op->index];
              if (!recv.done && recv.started) {
                Deliver(*op, recv);
                changed = true;
              }
            }
          } else if (kind == CommOp::kRecv) {
            Channel& channel = ChannelOf(op->call.peer, r);
            if (!op->done && channel.sends.size() > op->index) {
              Op& send = *channel.sends[op->index];
              if (send.started) {
                Deliver(send, *op);
                changed = true;
              }
            }
          } else if (!op->done) {
            changed |= TryCollective(op->index);
          }
        }
        if (!std::all_of(group.ops.begin(), group.ops.end(),
                         [](const auto& op) { return op->done; })) {
          break;
        }
        for (const auto& op : group.ops) op->group_done = true;
        queue.pop_front();
        changed = true;
      }
    }
    any |= changed;
  }
  return any;
}

std::string NcclRulesFabric::Impl::DescribeStuck(int r) const {
  const RankState& rank = ranks[r];
  std::string line = absl::StrCat("rank ", r,
                                  rank.waiting_on != nullptr
                                      ? absl::StrCat(" waits for its ", rank.waiting_on->describe)
                                      : std::string(" has finished"));
  if (rank.queue.empty()) return line;
  const Group& group = *rank.queue.front();
  absl::StrAppend(&line, ", its communicator runs ", group.Describe());
  std::vector<std::string> why;
  for (const auto& op : group.ops) {
    if (op->done) continue;
    if (op->call.op == CommOp::kSend) {
      why.push_back(absl::StrCat("send to rank ", op->call.peer, " waits for rank ", op->call.peer,
                                 " to start the receive"));
    } else if (op->call.op == CommOp::kRecv) {
      why.push_back(absl::StrCat("receive from rank ", op->call.peer, " waits for rank ",
                                 op->call.peer, " to start the send"));
    } else {
      why.push_back(absl::StrCat(op->describe, " waits for every rank to start it"));
    }
  }
  if (!why.empty()) absl::StrAppend(&line, ", whose ", absl::StrJoin(why, " and "));
  return line;
}

void NcclRulesFabric::Impl::CheckDeadlock() {
  if (!deadlock.empty()) return;
  bool waiting = false;
  for (const RankState& rank : ranks) {
    if (rank.finished && rank.waiting_on == nullptr) continue;
    if (rank.waiting_on == nullptr || rank.waiting_on->group_done) return;  // running, or will be
    waiting = true;
  }
  if (!waiting) return;
  std::vector<std::string> lines;
  for (int r = 0; r < size; ++r) lines.push_back(DescribeStuck(r));
  deadlock = absl::StrCat("deadlock under NCCL's rules: ", absl::StrJoin(lines, "; "));
  cv.notify_all();
}

// ---- Handles -----------------------------------------------------------------------------------

namespace {

class RulesHandle final : public parallel::CommHandle {
 public:
  RulesHandle(std::shared_ptr<NcclRulesFabric::Impl> fabric, std::shared_ptr<Op> op)
      : fabric_(std::move(fabric)), op_(std::move(op)) {}
  ~RulesHandle() override {
    if (!waited_) Wait().IgnoreError();  // as NCCL's handles: the tensors may still be in use
  }

  absl::Status Wait() override {
    if (waited_)
      return absl::FailedPreconditionError(absl::StrCat(op_->describe, ": waited twice"));
    waited_ = true;
    NcclRulesFabric::Impl& f = *fabric_;
    std::unique_lock<std::mutex> lock(f.mu);
    NcclRulesFabric::Impl::RankState& rank = f.ranks[op_->rank];
    rank.waiting_on = op_.get();
    f.CheckDeadlock();
    f.cv.wait(lock, [&] { return op_->group_done || !f.deadlock.empty() || !f.fatal.ok(); });
    rank.waiting_on = nullptr;
    if (!op_->group_done) {
      if (!f.fatal.ok()) return f.fatal;
      return absl::FailedPreconditionError(f.deadlock);
    }
    NF_RETURN_IF_ERROR(op_->status);
    if (op_->call.op == CommOp::kSend &&
        std::memcmp(op_->snapshot.data(), op_->call.tensor.raw_data(), op_->snapshot.size()) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", op_->rank, "'s ", op_->describe,
                       ": its buffer changed before Wait(); on a GPU NCCL reads it in between"));
    }
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<NcclRulesFabric::Impl> fabric_;
  std::shared_ptr<Op> op_;
  bool waited_ = false;
};

std::string Describe(const NcclRulesCommunicator::Call& call) {
  const std::string tensor =
      absl::StrCat(DTypeName(call.tensor.dtype()), ShapeToString(call.tensor.shape()));
  switch (call.op) {
    case CommOp::kSend:
      return absl::StrCat("send ", tensor, " to rank ", call.peer);
    case CommOp::kRecv:
      return absl::StrCat("recv ", tensor, " from rank ", call.peer);
    case CommOp::kAllReduce:
      return absl::StrCat("all_reduce ", call.reduce == ReduceOp::kSum ? "sum" : "max", " of ",
                          tensor);
    case CommOp::kBroadcast:
      return absl::StrCat("broadcast of ", tensor, " from rank ", call.peer);
    case CommOp::kAllGather:
    case CommOp::kReduceScatter:
      return absl::StrCat(parallel::CommOpName(call.op), " of ", tensor, " into ",
                          DTypeName(call.output.dtype()), ShapeToString(call.output.shape()));
    default:
      return "barrier";
  }
}

}  // namespace

// ---- The fabric and its communicators ----------------------------------------------------------

NcclRulesFabric::NcclRulesFabric(int size) : NcclRulesFabric(size, Options{}) {}
NcclRulesFabric::NcclRulesFabric(int size, Options options)
    : impl_(std::make_shared<Impl>(size, options)) {}
NcclRulesFabric::~NcclRulesFabric() = default;
int NcclRulesFabric::size() const { return impl_->size; }

std::unique_ptr<NcclRulesCommunicator> NcclRulesFabric::Join(int rank, std::string name) {
  return std::make_unique<NcclRulesCommunicator>(impl_, rank, std::move(name));
}

NcclRulesCommunicator::NcclRulesCommunicator(std::shared_ptr<NcclRulesFabric::Impl> fabric,
                                             int rank, std::string name)
    : fabric_(std::move(fabric)), rank_(rank), name_(std::move(name)) {}

NcclRulesCommunicator::~NcclRulesCommunicator() {
  std::lock_guard<std::mutex> lock(fabric_->mu);
  fabric_->ranks[rank_].finished = true;
  fabric_->CheckDeadlock();
}

int NcclRulesCommunicator::size() const { return fabric_->size; }

absl::StatusOr<std::vector<std::unique_ptr<parallel::CommHandle>>> NcclRulesCommunicator::Issue(
    std::vector<Call> calls) {
  namespace internal = parallel::internal;
  for (const Call& c : calls) {
    switch (c.op) {
      case CommOp::kSend:
      case CommOp::kRecv:
        NF_RETURN_IF_ERROR(internal::CheckPeer(c.op, name_, rank_, size(), c.peer, c.tensor));
        break;
      case CommOp::kAllReduce:
        NF_RETURN_IF_ERROR(internal::CheckReducible(c.op, name_, "tensor", c.tensor));
        break;
      case CommOp::kBroadcast:
        NF_RETURN_IF_ERROR(internal::CheckRoot(name_, size(), c.peer, c.tensor));
        break;
      case CommOp::kAllGather:
        NF_RETURN_IF_ERROR(internal::CheckAllGather(name_, size(), c.tensor, c.output));
        break;
      case CommOp::kReduceScatter:
        NF_RETURN_IF_ERROR(internal::CheckReduceScatter(name_, size(), c.tensor, c.output));
        break;
      default:
        break;
    }
  }
  NcclRulesFabric::Impl& f = *fabric_;
  std::vector<std::unique_ptr<parallel::CommHandle>> handles;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    auto group = std::make_shared<Group>();
    for (Call& c : calls) {
      auto op = std::make_shared<Op>();
      op->rank = rank_;
      op->describe = Describe(c);
      if (c.op == CommOp::kSend) {
        const auto* bytes = static_cast<const uint8_t*>(c.tensor.raw_data());
        op->snapshot.assign(bytes, bytes + c.tensor.nbytes());
        auto& sends = f.ChannelOf(rank_, c.peer).sends;
        op->index = sends.size();
        sends.push_back(op);
      } else if (c.op == CommOp::kRecv) {
        auto& recvs = f.ChannelOf(c.peer, rank_).recvs;
        op->index = recvs.size();
        recvs.push_back(op);
      } else {
        auto& mine = f.ranks[rank_].collectives;
        op->index = mine.size();
        for (int q = 0; q < size(); ++q) {
          const auto& theirs = f.ranks[q].collectives;
          if (q == rank_ || theirs.size() <= op->index ||
              theirs[op->index]->describe == op->describe)
            continue;
          f.fatal = absl::FailedPreconditionError(absl::StrCat(
              "collective ", op->index, " on group ", name_, ": rank ", rank_, " issued ",
              op->describe, ", rank ", q, " issued ", theirs[op->index]->describe,
              "; every rank must issue the group's collectives in the same order"));
          f.cv.notify_all();
          return f.fatal;
        }
        mine.push_back(op);
      }
      op->call = std::move(c);
      const int64_t bytes = op->call.op == CommOp::kAllGather
                                ? static_cast<int64_t>(op->call.output.nbytes())
                                : static_cast<int64_t>(op->call.tensor.nbytes());
      Count(op->call.op, op->call.op == CommOp::kBarrier ? 0 : bytes);
      group->ops.push_back(op);
      handles.push_back(std::make_unique<RulesHandle>(fabric_, op));
    }
    if (!group->ops.empty()) f.ranks[rank_].queue.push_back(std::move(group));
    if (f.Progress()) f.cv.notify_all();
  }
  return handles;
}

namespace {

// Built field by field: GCC 12 takes a defaulted Tensor in a braced initializer for an
// uninitialized read (-Wmaybe-uninitialized).
NcclRulesCommunicator::Call MakeCall(CommOp op, const Tensor& tensor, int peer = -1,
                                     const Tensor* output = nullptr,
                                     ReduceOp reduce = ReduceOp::kSum) {
  NcclRulesCommunicator::Call call;
  call.op = op;
  call.tensor = tensor;
  if (output != nullptr) call.output = *output;
  call.peer = peer;
  call.reduce = reduce;
  return call;
}

}  // namespace

absl::StatusOr<std::unique_ptr<parallel::CommHandle>> NcclRulesCommunicator::IssueOne(Call call) {
  std::vector<Call> calls;
  calls.push_back(std::move(call));
  NF_ASSIGN_OR_RETURN(auto handles, Issue(std::move(calls)));
  return std::move(handles.front());
}

absl::StatusOr<std::vector<std::unique_ptr<parallel::CommHandle>>>
NcclRulesCommunicator::StartBatch(absl::Span<const parallel::Transfer> transfers) {
  std::vector<Call> calls;
  for (const parallel::Transfer& t : transfers) {
    NF_RETURN_IF_ERROR(parallel::internal::CheckBatchable(t.op, name_));
    calls.push_back(MakeCall(t.op, t.tensor, t.peer));
  }
  return Issue(std::move(calls));
}

absl::StatusOr<std::unique_ptr<parallel::CommHandle>> NcclRulesCommunicator::AllReduceAsync(
    const Tensor& tensor, ReduceOp op) {
  return IssueOne(MakeCall(CommOp::kAllReduce, tensor, -1, nullptr, op));
}
absl::StatusOr<std::unique_ptr<parallel::CommHandle>> NcclRulesCommunicator::ReduceScatterAsync(
    const Tensor& input, const Tensor& output) {
  return IssueOne(MakeCall(CommOp::kReduceScatter, input, -1, &output));
}
absl::StatusOr<std::unique_ptr<parallel::CommHandle>> NcclRulesCommunicator::AllGatherAsync(
    const Tensor& input, const Tensor& output) {
  return IssueOne(MakeCall(CommOp::kAllGather, input, -1, &output));
}
absl::StatusOr<std::unique_ptr<parallel::CommHandle>> NcclRulesCommunicator::SendAsync(
    const Tensor& tensor, int peer) {
  return IssueOne(MakeCall(CommOp::kSend, tensor, peer));
}
absl::StatusOr<std::unique_ptr<parallel::CommHandle>> NcclRulesCommunicator::RecvAsync(
    const Tensor& tensor, int peer) {
  return IssueOne(MakeCall(CommOp::kRecv, tensor, peer));
}

absl::Status NcclRulesCommunicator::AllReduce(const Tensor& tensor, ReduceOp op) {
  NF_ASSIGN_OR_RETURN(auto handle, AllReduceAsync(tensor, op));
  return handle->Wait();
}
absl::Status NcclRulesCommunicator::ReduceScatter(const Tensor& input, const Tensor& output) {
  NF_ASSIGN_OR_RETURN(auto handle, ReduceScatterAsync(input, output));
  return handle->Wait();
}
absl::Status NcclRulesCommunicator::AllGather(const Tensor& input, const Tensor& output) {
  NF_ASSIGN_OR_RETURN(auto handle, AllGatherAsync(input, output));
  return handle->Wait();
}
absl::Status NcclRulesCommunicator::Broadcast(const Tensor& tensor, int root) {
  NF_ASSIGN_OR_RETURN(auto handle, IssueOne(MakeCall(CommOp::kBroadcast, tensor, root)));
  return handle->Wait();
}
absl::Status NcclRulesCommunicator::Send(const Tensor& tensor, int peer) {
  NF_ASSIGN_OR_RETURN(auto handle, SendAsync(tensor, peer));
  return handle->Wait();
}
absl::Status NcclRulesCommunicator::Recv(const Tensor& tensor, int peer) {
  NF_ASSIGN_OR_RETURN(auto handle, RecvAsync(tensor, peer));
  return handle->Wait();
}
absl::Status NcclRulesCommunicator::Barrier() {
  NF_ASSIGN_OR_RETURN(auto handle, IssueOne(MakeCall(CommOp::kBarrier, Tensor())));
  return handle->Wait();
}

}  // namespace nf::testing
