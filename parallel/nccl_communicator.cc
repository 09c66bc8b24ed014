#include "parallel/nccl_communicator.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "core/cuda/outstanding_communication.h"
#include "core/status.h"
#include "core/trace_range.h"
#include "parallel/comm_checks.h"
#include "parallel/flight_recorder.h"
#include "parallel/settling_queue.h"

namespace nf::parallel {
namespace {

constexpr absl::string_view kCreate = "create NCCL communicator";

absl::Status CudaError(cudaError_t error, absl::string_view operation, absl::string_view group,
                       absl::string_view call) {
  return absl::InternalError(absl::StrCat(operation, " on group ", group, ": ", call,
                                          " failed: ", cudaGetErrorName(error), ": ",
                                          cudaGetErrorString(error)));
}

absl::Status NcclError(ncclResult_t result, absl::string_view operation, absl::string_view group,
                       absl::string_view call, ncclComm_t comm) {
  // NCCL's last error names the failing system call or peer, which its result code does not.
  const char* last = ncclGetLastError(comm);
  const absl::StatusCode code = result == ncclInvalidArgument || result == ncclInvalidUsage
                                    ? absl::StatusCode::kInvalidArgument
                                    : absl::StatusCode::kInternal;
  return absl::Status(
      code,
      absl::StrCat(
          operation, " on group ", group, ": ", call, " failed: ", ncclGetErrorString(result),
          last != nullptr && last[0] != '\0' ? absl::StrCat(" (", last, ")") : std::string()));
}

// Makes `device` the calling thread's current CUDA device for a scope: NCCL and the stream and
// event calls act on the current device, and the caller's thread may be using another.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) : device_(device) {
    error_ = cudaGetDevice(&previous_);
    if (error_ == cudaSuccess && previous_ != device_) error_ = cudaSetDevice(device_);
  }
  ~ScopedDevice() {
    if (error_ == cudaSuccess && previous_ != device_) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  absl::Status status(absl::string_view operation, absl::string_view group) const {
    if (error_ == cudaSuccess) return absl::OkStatus();
    return CudaError(error_, operation, group, absl::StrCat("cudaSetDevice(", device_, ")"));
  }

 private:
  int device_;
  int previous_ = -1;
  cudaError_t error_;
};

absl::string_view NcclCallName(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce:
      return "ncclAllReduce";
    case CommOp::kReduceScatter:
      return "ncclReduceScatter";
    case CommOp::kAllGather:
      return "ncclAllGather";
    case CommOp::kBroadcast:
      return "ncclBroadcast";
    case CommOp::kSend:
      return "ncclSend";
    case CommOp::kRecv:
      return "ncclRecv";
    case CommOp::kBarrier:
      return "ncclAllReduce (barrier)";
    case CommOp::kCount:
      break;
  }
  return "nccl";
}

std::string DescribeTensors(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) return "no tensor";
  return absl::StrJoin(tensors, " -> ", [](std::string* out, const Tensor& t) {
    absl::StrAppend(out, t.DebugString());
  });
}

}  // namespace

// The events of one operation, shared by its handle, the watchdog that polls it and the
// communicator that adds its time to the stats once complete; destroyed by the last of them.
struct NcclOpEvents {
  NcclOpEvents(CommOp op, int device) : op(op), device(device) {}
  ~NcclOpEvents() {
    Uncount();
    for (cudaEvent_t event : {ready, started, done}) {
      if (event != nullptr) cudaEventDestroy(event);
    }
  }
  NcclOpEvents(const NcclOpEvents&) = delete;
  NcclOpEvents& operator=(const NcclOpEvents&) = delete;

  const CommOp op;
  const int device;
  cudaEvent_t ready = nullptr;    // on the compute stream: the inputs are written
  cudaEvent_t started = nullptr;  // on the communication stream: the group starts
  cudaEvent_t done = nullptr;     // on the communication stream: the group ended
  int group_size = 1;             // the group's time is shared evenly among its operations
  uint64_t flight = 0;            // the flight recorder's id, completed once `done` passed

  // The operation counts in the device's outstanding communication (outstanding_communication.h)
  // from just before its group is issued until it is seen complete (or never ran and is gone).
  void Count() {
    counted.store(true);
    cuda::AddOutstandingCommunication(device, 1);
  }
  void Uncount() const {
    if (counted.exchange(false)) cuda::AddOutstandingCommunication(device, -1);
  }
  mutable std::atomic<bool> counted{false};
};

struct NcclCommunicator::State {
  ~State() {
    // Every handle is gone, but the operations they waited for may still run on the GPU: the
    // host waits for them (a hang is still the watchdog's) before the communicator goes.
    // Errors are ignored, as at exit the CUDA runtime may already be unloading.
    ScopedDevice on_device(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    // An aborted NCCL communicator must not be used again, not even destroyed.
    const bool aborted = in_flight != nullptr && in_flight->aborting();
    in_flight.reset();
    untimed.clear();
    if (comm != nullptr && !aborted) ncclCommDestroy(comm);
    if (barrier_value != nullptr) cudaFree(barrier_value);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  std::string name;
  std::vector<int> world_ranks;  // by group rank
  std::vector<int> others;       // world_ranks without this rank: a collective's missing peers
  int rank = 0;
  int device = 0;
  WatchdogOptions watchdog;
  NcclCommunicator::Options hooks;  // the watchdog's replaceable end (tests)
  cudaStream_t compute = nullptr;
  cudaStream_t stream = nullptr;     // communication
  int32_t* barrier_value = nullptr;  // one device int, all-reduced by Barrier (max: stays 0)
  ncclComm_t comm = nullptr;
  // Polls every issued operation until it completes, and the host calls NCCL blocks in; made
  // before ncclCommInitRank.
  std::unique_ptr<AsyncWatchdog> in_flight;

  // Aborting. The thread that issues holds `issue_mutex` from its check of
  // in_flight->aborting() to the end of the NCCL group, so that once the watchdog aborting
  // holds it no NCCL call is under way or starts. The one exception is a host call NCCL blocks
  // in (`in_blocking_call`): ncclCommAbort is what makes it return, so the watchdog aborts
  // without the mutex then. `abortable` is the communicator once ncclCommInitRank returned.
  std::mutex issue_mutex;
  std::atomic<bool> in_blocking_call{false};
  std::atomic<ncclComm_t> abortable{nullptr};

  // The watchdog's before_abort, on its thread, after aborting() became true.
  void Abort() {
    std::unique_lock<std::mutex> lock(issue_mutex, std::defer_lock);
    while (!lock.try_lock()) {
      if (in_blocking_call.load()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (ncclComm_t c = abortable.load(); c != nullptr) ncclCommAbort(c);
  }

  // For a thread that found the communicator aborting, or whose NCCL call failed meanwhile:
  // waits until the watchdog has ended the job (forever, but in tests), so that no error of
  // this thread ends the process first (exit 1 instead of the watchdog's 134).
  absl::Status Park(absl::string_view operation, absl::string_view call) const {
    in_flight->AwaitJobEnd();
    return absl::AbortedError(absl::StrCat(operation, " on group ", name, ": ", call,
                                           " not issued: the watchdog is aborting the job"));
  }

  // Watches a host call NCCL may block in, from now until the returned flag is set.
  std::shared_ptr<std::atomic<bool>> WatchHostCall(std::string operation,
                                                   std::vector<int> peers) const {
    auto returned = std::make_shared<std::atomic<bool>>(false);
    in_flight->Watch({.operation = std::move(operation),
                      .group = name,
                      .group_ranks = world_ranks,
                      .peers = std::move(peers),
                      .poll = [returned]() -> absl::StatusOr<bool> { return returned->load(); }});
    return returned;
  }
  // The communicator's stats (Communicator::shared_stats), which completed operations add
  // their time to: shared, so a handle waited for after the communicator is gone writes to
  // live memory.
  std::shared_ptr<CommStats> stats;
  // Operations waited for whose time is not yet in the stats, in issue order (the order they
  // complete in on the one communication stream). Owner thread only. Bounded: every Wait()
  // settles the completed ones first (settling_queue.h), so a process that never reads stats()
  // (nf-eval, nf-generate) does not keep three events per operation for the whole run.
  SettlingQueue<std::shared_ptr<NcclOpEvents>> untimed;

  // Adds a completed operation's time to the stats and marks it completed in the flight
  // recorder: true, or false while it still runs (or failed: the watchdog's to report).
  bool Settle(const std::shared_ptr<NcclOpEvents>& op_events) const {
    const NcclOpEvents& events = *op_events;
    if (cudaEventQuery(events.done) != cudaSuccess) return false;
    events.Uncount();
    FlightRecorder::Get().Completed(events.flight);
    float milliseconds = 0.0f;
    if (stats != nullptr &&
        cudaEventElapsedTime(&milliseconds, events.started, events.done) == cudaSuccess) {
      stats->seconds[static_cast<int>(events.op)] += milliseconds / 1000.0 / events.group_size;
    }
    return true;
  }
};

// One operation: its NCCL arguments, the tensors it touches (kept alive, and named in errors,
// as long as the handle) and its events.
class NcclPendingOp final : public CommHandle {
 public:
  NcclPendingOp(std::shared_ptr<NcclCommunicator::State> state, CommOp op, internal::NcclPlan plan,
                std::vector<Tensor> tensors)
      : state_(std::move(state)),
        op_(op),
        plan_(plan),
        tensors_(std::move(tensors)),
        events_(std::make_shared<NcclOpEvents>(op, state_->device)) {
    if (op == CommOp::kSend || op == CommOp::kRecv) {
      peer_world_rank_ = state_->world_ranks[plan_.peer];
    }
  }

  ~NcclPendingOp() override {
    // A dropped handle still orders the compute stream after its operation, so that the
    // tensors' memory is reused only after NCCL is done with it (caching_allocator.h).
    if (issued_ && !waited_) Wait().IgnoreError();
  }

  CommOp op() const { return op_; }
  // The tensors, for errors ("f16[8] on cuda:0 -> f16[2] on cuda:0").
  std::string Describe() const { return DescribeTensors(tensors_); }

  // Creates the events and records `ready` on the compute stream: the operation will read and
  // write its tensors only after the kernels issued before this call. `started` and `done`
  // time the operation on the communication stream (CommStats::seconds).
  absl::Status Prepare() {
    const State& s = *state_;
    NcclOpEvents& e = *events_;
    for (auto [event, flags] :
         {std::pair{&e.ready, cudaEventDisableTiming}, std::pair{&e.started, cudaEventDefault},
          std::pair{&e.done, cudaEventDefault}}) {
      const cudaError_t error = cudaEventCreateWithFlags(event, flags);
      if (error != cudaSuccess) {
        return CudaError(error, CommOpName(op_), s.name, "cudaEventCreateWithFlags");
      }
    }
    const cudaError_t error = cudaEventRecord(e.ready, s.compute);
    if (error == cudaSuccess) return absl::OkStatus();
    return CudaError(error, CommOpName(op_), s.name, "cudaEventRecord on the compute stream");
  }

  // Makes the communication stream wait for `ready`; called before the NCCL group starts.
  absl::Status OrderAfterCompute() {
    const cudaError_t error = cudaStreamWaitEvent(state_->stream, events_->ready, 0);
    if (error == cudaSuccess) return absl::OkStatus();
    return CudaError(error, CommOpName(op_), state_->name,
                     "cudaStreamWaitEvent on the communication stream");
  }

  // Marks where the operation's group of `group_size` operations starts on the communication
  // stream (its inputs ready).
  absl::Status RecordStart(size_t group_size) {
    events_->group_size = static_cast<int>(group_size);
    const cudaError_t error = cudaEventRecord(events_->started, state_->stream);
    if (error == cudaSuccess) return absl::OkStatus();
    return CudaError(error, CommOpName(op_), state_->name,
                     "cudaEventRecord on the communication stream");
  }

  // The NCCL call, inside the caller's ncclGroupStart/End.
  ncclResult_t Call() const {
    State& s = *state_;
    const internal::NcclPlan& p = plan_;
    switch (op_) {
      case CommOp::kAllReduce:
        return ncclAllReduce(p.send, p.recv, p.count, p.type, p.reduce, s.comm, s.stream);
      case CommOp::kReduceScatter:
        return ncclReduceScatter(p.send, p.recv, p.count, p.type, p.reduce, s.comm, s.stream);
      case CommOp::kAllGather:
        return ncclAllGather(p.send, p.recv, p.count, p.type, s.comm, s.stream);
      case CommOp::kBroadcast:
        return ncclBroadcast(p.send, p.recv, p.count, p.type, p.peer, s.comm, s.stream);
      case CommOp::kSend:
        return ncclSend(p.send, p.count, p.type, p.peer, s.comm, s.stream);
      case CommOp::kRecv:
        return ncclRecv(p.recv, p.count, p.type, p.peer, s.comm, s.stream);
      case CommOp::kBarrier:
        return ncclAllReduce(s.barrier_value, s.barrier_value, 1, ncclInt32, ncclMax, s.comm,
                             s.stream);
      case CommOp::kCount:
        break;
    }
    return ncclInternalError;
  }

  // Marks the operation's end on the communication stream and puts it under the watchdog;
  // from then on it must be waited for.
  absl::Status RecordDone() {
    State& s = *state_;
    const cudaError_t error = cudaEventRecord(events_->done, s.stream);
    if (error != cudaSuccess) {
      return CudaError(error, CommOpName(op_), s.name,
                       "cudaEventRecord on the communication stream");
    }
    issued_ = true;
    s.in_flight->Watch(
        {.operation = std::string(CommOpName(op_)),
         .group = s.name,
         .group_ranks = s.world_ranks,
         .peers = peer_world_rank_ >= 0 ? std::vector<int>{peer_world_rank_} : s.others,
         .poll = [events = events_, comm = s.comm, name = s.name,
                  call = absl::StrCat(NcclCallName(op_), " of ", Describe())] {
           return PollInFlight(*events, comm, name, call);
         }});
    return absl::OkStatus();
  }

  void set_flight(uint64_t id) { events_->flight = id; }

  // Orders the compute stream's later kernels after the operation; the host does not wait
  // (the watchdog's thread watches the operation instead).
  absl::Status Wait() override {
    const absl::string_view operation = CommOpName(op_);
    State& s = *state_;
    if (waited_) {
      return internal::CommError(absl::StatusCode::kFailedPrecondition, op_, s.name,
                                 absl::StrCat("Wait() called twice on the handle of ", Describe()));
    }
    waited_ = true;
    if (!issued_) {
      return internal::CommError(absl::StatusCode::kAborted, op_, s.name,
                                 absl::StrCat(NcclCallName(op_), " of ", Describe(),
                                              " was never issued: an earlier call failed"));
    }
    ScopedDevice on_device(s.device);
    NF_RETURN_IF_ERROR(on_device.status(operation, s.name));
    const cudaError_t error = cudaStreamWaitEvent(s.compute, events_->done, 0);
    if (error != cudaSuccess) {
      return CudaError(error, operation, s.name, "cudaStreamWaitEvent on the compute stream");
    }
    s.untimed.Push(events_, [&s](const std::shared_ptr<NcclOpEvents>& e) { return s.Settle(e); });
    return absl::OkStatus();
  }

  // Blocks the host until the operation completed (Barrier's meaning); a hang ends the job
  // from the watchdog's thread meanwhile.
  absl::Status WaitOnHost() {
    NF_RETURN_IF_ERROR(Wait());
    const cudaError_t error = cudaEventSynchronize(events_->done);
    if (error == cudaSuccess) return absl::OkStatus();
    return CudaError(error, CommOpName(op_), state_->name, "cudaEventSynchronize");
  }

  // Issues `ops` on the communication stream as one NCCL group (one kernel, in which NCCL
  // progresses every send and receive at once) and records each one's completion.
  static absl::Status IssueGroup(NcclCommunicator::State& s, absl::Span<NcclPendingOp* const> ops);

 private:
  using State = NcclCommunicator::State;

  // The watchdog's poll, on its thread: true once `events.done` passed, false while running,
  // an error when CUDA or NCCL (asynchronously: a lost peer, a network error) reports one.
  static absl::StatusOr<bool> PollInFlight(const NcclOpEvents& events, ncclComm_t comm,
                                           const std::string& group, const std::string& call) {
    const absl::string_view operation = CommOpName(events.op);
    // Events and communicator belong to the device; the thread never needs another, so it is
    // set once and never restored (restoring cuda:0 would make a context there).
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != events.device) {
      cudaSetDevice(events.device);
    }
    const cudaError_t error = cudaEventQuery(events.done);
    if (error == cudaSuccess) {
      events.Uncount();
      FlightRecorder::Get().Completed(events.flight);
      return true;
    }
    if (error != cudaErrorNotReady) {
      return CudaError(error, operation, group, absl::StrCat("cudaEventQuery after ", call));
    }
    ncclResult_t async = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm, &async);
    if (result != ncclSuccess) {
      return NcclError(result, operation, group, "ncclCommGetAsyncError", comm);
    }
    if (async == ncclSuccess || async == ncclInProgress) return false;
    return NcclError(async, operation, group, call, comm);
  }

  std::shared_ptr<State> state_;
  CommOp op_;
  internal::NcclPlan plan_;
  std::vector<Tensor> tensors_;
  std::shared_ptr<NcclOpEvents> events_;
  int peer_world_rank_ = -1;
  bool issued_ = false;
  bool waited_ = false;
};

absl::Status NcclPendingOp::IssueGroup(NcclCommunicator::State& s,
                                       absl::Span<NcclPendingOp* const> ops) {
  if (ops.empty()) return absl::OkStatus();
  const NcclPendingOp& last = *ops.back();
  const absl::string_view operation = CommOpName(last.op_);
  ScopedDevice on_device(s.device);
  NF_RETURN_IF_ERROR(on_device.status(operation, s.name));
  for (NcclPendingOp* op : ops) NF_RETURN_IF_ERROR(op->OrderAfterCompute());
  for (NcclPendingOp* op : ops) NF_RETURN_IF_ERROR(op->RecordStart(ops.size()));
  const std::string call = absl::StrCat(
      NcclCallName(last.op_), " of ", last.Describe(),
      ops.size() > 1 ? absl::StrCat(" (in a group of ", ops.size(), " operations)") : "");
  std::unique_lock<std::mutex> issuing(s.issue_mutex);
  if (s.in_flight->aborting()) {
    issuing.unlock();
    return s.Park(operation, call);
  }
  // ncclGroupEnd blocks the host while NCCL connects to a peer for the first time: watched from
  // here, naming the peers the group talks to.
  std::vector<int> peers;
  for (const NcclPendingOp* op : ops) {
    if (op->peer_world_rank_ < 0) {
      peers = s.others;
      break;
    }
    if (std::find(peers.begin(), peers.end(), op->peer_world_rank_) == peers.end()) {
      peers.push_back(op->peer_world_rank_);
    }
  }
  const auto returned =
      s.WatchHostCall(absl::StrCat(CommOpName(last.op_), ops.size() > 1 ? " group" : "",
                                   " (host blocked in ncclGroupEnd)"),
                      std::move(peers));
  for (NcclPendingOp* op : ops) op->events_->Count();
  ncclResult_t result = ncclGroupStart();
  const NcclPendingOp* failed = nullptr;
  for (const NcclPendingOp* op : ops) {
    if (result != ncclSuccess) break;
    result = op->Call();
    if (result != ncclSuccess) failed = op;
  }
  // Ends the group even after a failed call, which NCCL needs to drop the group's state.
  s.in_blocking_call = true;
  const ncclResult_t ended = ncclGroupEnd();
  s.in_blocking_call = false;
  *returned = true;
  issuing.unlock();
  if (result == ncclSuccess) result = ended;
  if (result != ncclSuccess && s.in_flight->aborting()) return s.Park(operation, call);
  if (result != ncclSuccess) {
    // Never ran: no longer outstanding.
    for (NcclPendingOp* op : ops) op->events_->Uncount();
    const NcclPendingOp& culprit = failed != nullptr ? *failed : last;
    return NcclError(
        result, CommOpName(culprit.op_), s.name,
        absl::StrCat(NcclCallName(culprit.op_), " of ", culprit.Describe(),
                     ops.size() > 1 ? absl::StrCat(" (in a group of ", ops.size(), " operations)")
                                    : std::string()),
        s.comm);
  }
  for (NcclPendingOp* op : ops) NF_RETURN_IF_ERROR(op->RecordDone());
  return absl::OkStatus();
}

// ---- Creation -----------------------------------------------------------------------------------

namespace {

// This rank's half of creation, before any other rank is involved: the device exists, the
// compute stream belongs to it, and the communication stream and barrier int exist.
absl::Status PrepareDevice(NcclCommunicator::State& s) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) return CudaError(error, kCreate, s.name, "cudaGetDeviceCount");
  if (s.device < 0 || s.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat(kCreate, " on group ", s.name, ": device ", s.device, " is not one of the ",
                     count, " CUDA devices of this process (cuda:0 to cuda:", count - 1, ")"));
  }
  ScopedDevice on_device(s.device);
  NF_RETURN_IF_ERROR(on_device.status(kCreate, s.name));
  if (s.compute != nullptr) {
    int stream_device = -1;
    error = cudaStreamGetDevice(s.compute, &stream_device);
    if (error != cudaSuccess) {
      return CudaError(error, kCreate, s.name, "cudaStreamGetDevice of the compute stream");
    }
    if (stream_device != s.device) {
      return absl::InvalidArgumentError(absl::StrCat(
          kCreate, " on group ", s.name, ": the compute stream belongs to cuda:", stream_device,
          ", not to the communicator's device cuda:", s.device));
    }
  }
  // The communication stream at the device's greatest priority: a collective overlapped with
  // the backward (data-parallel buckets, ZeRO's gathers) starts as soon as its inputs are ready
  // instead of queueing behind the compute stream's kernels for the GPU's SMs.
  int least_priority = 0, greatest_priority = 0;
  error = cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority);
  if (error != cudaSuccess) {
    return CudaError(error, kCreate, s.name, "cudaDeviceGetStreamPriorityRange");
  }
  error =
      cudaStreamCreateWithPriority(&s.stream, cudaStreamNonBlocking,
                                   internal::CommStreamPriority(least_priority, greatest_priority));
  if (error != cudaSuccess) {
    return CudaError(error, kCreate, s.name, "cudaStreamCreateWithPriority");
  }
  error = cudaMalloc(&s.barrier_value, sizeof(int32_t));
  if (error != cudaSuccess) return CudaError(error, kCreate, s.name, "cudaMalloc of 4 bytes");
  error = cudaMemset(s.barrier_value, 0, sizeof(int32_t));
  if (error != cudaSuccess) return CudaError(error, kCreate, s.name, "cudaMemset");
  return absl::OkStatus();
}

}  // namespace

std::shared_ptr<NcclCommunicator::State> NcclCommunicator::NewState(Members members, int device,
                                                                    cudaStream_t compute_stream,
                                                                    const Options& options) {
  auto state = std::make_shared<State>();
  state->name = std::move(members.name);
  state->world_ranks = std::move(members.world_ranks);
  state->others = state->world_ranks;
  if (members.rank >= 0 && members.rank < static_cast<int>(state->others.size())) {
    state->others.erase(state->others.begin() + members.rank);
  }
  state->rank = members.rank;
  state->device = device;
  state->watchdog = options.watchdog;
  state->hooks = options;
  state->compute = compute_stream;
  return state;
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::CreateWithId(
    Members members, const ncclUniqueId& id, int device, cudaStream_t compute_stream,
    Options options) {
  if (members.rank < 0 || members.rank >= static_cast<int>(members.world_ranks.size())) {
    return absl::InvalidArgumentError(absl::StrCat(kCreate, " on group ", members.name, ": rank ",
                                                   members.rank, " is not one of its ",
                                                   members.world_ranks.size(), " members"));
  }
  std::shared_ptr<State> state = NewState(std::move(members), device, compute_stream, options);
  NF_RETURN_IF_ERROR(PrepareDevice(*state));
  return Join(std::move(state), id);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const MpiCommunicator& group, int device, cudaStream_t compute_stream, Options options) {
  std::shared_ptr<State> state =
      NewState({.name = group.name(), .world_ranks = group.world_ranks(), .rank = group.rank()},
               device, compute_stream, options);

  // Every rank learns whether every rank is ready before any enters ncclCommInitRank, which
  // would wait inside NCCL, beyond the watchdog's reach, for a rank that gave up.
  const absl::Status prepared = PrepareDevice(*state);
  NF_ASSIGN_OR_RETURN(const int failed, group.MaxOverGroup(prepared.ok() ? 0 : 1));
  if (!prepared.ok()) return prepared;
  if (failed != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(kCreate, " on group ", state->name,
                     ": another rank could not set up its CUDA device (its error says why)"));
  }

  // Rank 0 makes the id; the first byte says whether it could.
  std::array<uint8_t, 1 + sizeof(ncclUniqueId)> message{};
  absl::Status id_status;
  if (state->rank == 0) {
    ncclUniqueId id;
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result == ncclSuccess) {
      message[0] = 1;
      std::memcpy(message.data() + 1, &id, sizeof(id));
    } else {
      id_status = NcclError(result, kCreate, state->name, "ncclGetUniqueId", nullptr);
    }
  }
  NF_RETURN_IF_ERROR(group.BroadcastBytes(absl::MakeSpan(message), 0));
  NF_RETURN_IF_ERROR(id_status);
  if (message[0] != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(kCreate, " on group ", state->name,
                     ": rank 0 could not make the NCCL id (its error says why)"));
  }
  ncclUniqueId id;
  std::memcpy(&id, message.data() + 1, sizeof(id));
  return Join(std::move(state), id);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Join(
    std::shared_ptr<State> state, const ncclUniqueId& id) {
  const int device = state->device;
  ScopedDevice on_device(device);
  NF_RETURN_IF_ERROR(on_device.status(kCreate, state->name));
  // The watchdog first: ncclCommInitRank blocks until every rank joined, and a rank that never
  // comes must be reported as one that stops later is. `s` outlives the watchdog (it owns it).
  AsyncWatchdog::Options watchdog{.watchdog = state->watchdog,
                                  // NCCL's kernels may wait forever for an absent peer; aborting
                                  // the communicator stops them before the job ends.
                                  .before_abort = [s = state.get()] { s->Abort(); },
                                  .abort_grace = state->hooks.abort_grace};
  if (state->hooks.report) watchdog.report = state->hooks.report;
  if (state->hooks.end_job) watchdog.end_job = state->hooks.end_job;
  if (state->hooks.hard_exit) watchdog.hard_exit = state->hooks.hard_exit;
  state->in_flight = std::make_unique<AsyncWatchdog>(std::move(watchdog));
  const std::string init_call = absl::StrCat("ncclCommInitRank on cuda:", device);
  const auto returned = state->WatchHostCall(
      absl::StrCat(kCreate, " (host blocked in ncclCommInitRank)"), state->others);
  ncclComm_t comm = nullptr;
  state->in_blocking_call = true;
  const ncclResult_t result =
      ncclCommInitRank(&comm, static_cast<int>(state->world_ranks.size()), id, state->rank);
  state->in_blocking_call = false;
  *returned = true;
  if (state->in_flight->aborting()) {
    // Too late: the watchdog gave up on the wait (and had no communicator to abort).
    if (result == ncclSuccess) state->comm = comm;
    return state->Park(kCreate, init_call);
  }
  if (result != ncclSuccess) {
    return NcclError(result, kCreate, state->name, init_call, nullptr);
  }
  {
    std::lock_guard<std::mutex> lock(state->issue_mutex);
    state->comm = comm;
    state->abortable = comm;
  }
  FlightRecorder::Get().RegisterGroup(
      {.group = state->name, .backend = "nccl", .world_ranks = state->world_ranks});
  std::unique_ptr<NcclCommunicator> communicator(new NcclCommunicator(std::move(state)));
  communicator->state_->stats = communicator->shared_stats();
  return communicator;
}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::size() const { return static_cast<int>(state_->world_ranks.size()); }
const std::string& NcclCommunicator::name() const { return state_->name; }
int NcclCommunicator::device() const { return state_->device; }
cudaStream_t NcclCommunicator::compute_stream() const { return state_->compute; }
cudaStream_t NcclCommunicator::comm_stream() const { return state_->stream; }
const std::vector<int>& NcclCommunicator::world_ranks() const { return state_->world_ranks; }
size_t NcclCommunicator::unsettled_operations() const { return state_->untimed.size(); }

// ---- Operations ---------------------------------------------------------------------------------

internal::NcclCaller NcclCommunicator::Caller() const {
  return {.group = state_->name, .rank = state_->rank, .size = size(), .device = state_->device};
}

absl::StatusOr<std::vector<std::unique_ptr<NcclPendingOp>>> NcclCommunicator::StartGroup(
    absl::Span<const Planned> ops) {
  State& s = *state_;
  for (const Planned& planned : ops) NF_RETURN_IF_ERROR(planned.plan.status());
  if (ops.empty()) return std::vector<std::unique_ptr<NcclPendingOp>>();
  const CommOp first = ops.front().op;
  const TraceRange trace(
      absl::StrCat("nccl ", CommOpName(first), ops.size() > 1 ? " group" : "", " on ", s.name));
  ScopedDevice on_device(s.device);
  NF_RETURN_IF_ERROR(on_device.status(CommOpName(first), s.name));
  std::vector<std::unique_ptr<NcclPendingOp>> pending;
  std::vector<NcclPendingOp*> group;
  for (const Planned& planned : ops) {
    pending.push_back(
        std::make_unique<NcclPendingOp>(state_, planned.op, *planned.plan, planned.tensors));
    NF_RETURN_IF_ERROR(pending.back()->Prepare());
    group.push_back(pending.back().get());
  }
  // Recorded before the group is issued: the watchdog's thread may see an operation complete
  // (and complete its record) as soon as it is.
  for (size_t i = 0; i < ops.size(); ++i) {
    const internal::NcclPlan& plan = *ops[i].plan;
    const bool has_peer =
        ops[i].op == CommOp::kSend || ops[i].op == CommOp::kRecv || ops[i].op == CommOp::kBroadcast;
    pending[i]->set_flight(
        RecordFlight("nccl", ops[i].op, plan.bytes,
                     ops[i].tensors.empty() ? DType::kI32 : ops[i].tensors.front().dtype(),
                     has_peer ? s.world_ranks[plan.peer] : -1));
  }
  NF_RETURN_IF_ERROR(NcclPendingOp::IssueGroup(s, group));
  for (const Planned& planned : ops) Count(planned.op, planned.plan->bytes);
  return pending;
}

absl::StatusOr<std::unique_ptr<NcclPendingOp>> NcclCommunicator::Start(
    CommOp op, const absl::StatusOr<internal::NcclPlan>& plan, std::vector<Tensor> tensors) {
  const Planned alone[] = {{.op = op, .plan = plan, .tensors = std::move(tensors)}};
  NF_ASSIGN_OR_RETURN(auto pending, StartGroup(alone));
  return std::move(pending.front());
}

absl::StatusOr<std::vector<std::unique_ptr<CommHandle>>> NcclCommunicator::StartBatch(
    absl::Span<const Transfer> transfers) {
  std::vector<Planned> ops;
  for (const Transfer& t : transfers) {
    NF_RETURN_IF_ERROR(internal::CheckBatchable(t.op, state_->name));
    ops.push_back({.op = t.op,
                   .plan = internal::PlanPointToPoint(Caller(), t.op, t.tensor, t.peer),
                   .tensors = {t.tensor}});
  }
  NF_ASSIGN_OR_RETURN(auto pending, StartGroup(ops));
  std::vector<std::unique_ptr<CommHandle>> handles;
  for (auto& op : pending) handles.push_back(std::move(op));
  return handles;
}

absl::Status NcclCommunicator::AllReduce(const Tensor& tensor, ReduceOp op) {
  NF_ASSIGN_OR_RETURN(auto pending, Start(CommOp::kAllReduce,
                                          internal::PlanAllReduce(Caller(), tensor, op), {tensor}));
  return pending->Wait();
}

absl::StatusOr<std::unique_ptr<CommHandle>> NcclCommunicator::AllReduceAsync(const Tensor& tensor,
                                                                             ReduceOp op) {
  NF_ASSIGN_OR_RETURN(auto pending, Start(CommOp::kAllReduce,
                                          internal::PlanAllReduce(Caller(), tensor, op), {tensor}));
  return std::unique_ptr<CommHandle>(std::move(pending));
}

absl::Status NcclCommunicator::ReduceScatter(const Tensor& input, const Tensor& output) {
  NF_ASSIGN_OR_RETURN(auto pending, ReduceScatterAsync(input, output));
  return pending->Wait();
}

absl::StatusOr<std::unique_ptr<CommHandle>> NcclCommunicator::ReduceScatterAsync(
    const Tensor& input, const Tensor& output) {
  NF_ASSIGN_OR_RETURN(auto pending,
                      Start(CommOp::kReduceScatter,
                            internal::PlanReduceScatter(Caller(), input, output), {input, output}));
  return std::unique_ptr<CommHandle>(std::move(pending));
}

absl::Status NcclCommunicator::AllGather(const Tensor& input, const Tensor& output) {
  NF_ASSIGN_OR_RETURN(auto pending, AllGatherAsync(input, output));
  return pending->Wait();
}

absl::StatusOr<std::unique_ptr<CommHandle>> NcclCommunicator::AllGatherAsync(const Tensor& input,
                                                                             const Tensor& output) {
  NF_ASSIGN_OR_RETURN(
      auto pending,
      Start(CommOp::kAllGather, internal::PlanAllGather(Caller(), input, output), {input, output}));
  return std::unique_ptr<CommHandle>(std::move(pending));
}

absl::Status NcclCommunicator::Broadcast(const Tensor& tensor, int root) {
  NF_ASSIGN_OR_RETURN(
      auto pending,
      Start(CommOp::kBroadcast, internal::PlanBroadcast(Caller(), tensor, root), {tensor}));
  return pending->Wait();
}

absl::Status NcclCommunicator::Send(const Tensor& tensor, int peer) {
  NF_ASSIGN_OR_RETURN(auto pending, SendAsync(tensor, peer));
  return pending->Wait();
}

absl::Status NcclCommunicator::Recv(const Tensor& tensor, int peer) {
  NF_ASSIGN_OR_RETURN(auto pending, RecvAsync(tensor, peer));
  return pending->Wait();
}

absl::StatusOr<std::unique_ptr<CommHandle>> NcclCommunicator::SendAsync(const Tensor& tensor,
                                                                        int peer) {
  NF_ASSIGN_OR_RETURN(
      auto pending,
      Start(CommOp::kSend, internal::PlanPointToPoint(Caller(), CommOp::kSend, tensor, peer),
            {tensor}));
  return std::unique_ptr<CommHandle>(std::move(pending));
}

absl::StatusOr<std::unique_ptr<CommHandle>> NcclCommunicator::RecvAsync(const Tensor& tensor,
                                                                        int peer) {
  NF_ASSIGN_OR_RETURN(
      auto pending,
      Start(CommOp::kRecv, internal::PlanPointToPoint(Caller(), CommOp::kRecv, tensor, peer),
            {tensor}));
  return std::unique_ptr<CommHandle>(std::move(pending));
}

absl::Status NcclCommunicator::Barrier() {
  NF_ASSIGN_OR_RETURN(auto pending, Start(CommOp::kBarrier, internal::NcclPlan{}, {}));
  return pending->WaitOnHost();
}

void NcclCommunicator::SettleStats() const {
  State& s = *state_;
  s.untimed.SettleCompleted([&s](const std::shared_ptr<NcclOpEvents>& e) { return s.Settle(e); });
}

}  // namespace nf::parallel
