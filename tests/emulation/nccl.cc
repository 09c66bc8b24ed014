// NCCL on the emulated GPUs: the C API subset parallel/nccl_communicator.cc calls, defined
// against NCCL's own nccl.h, with NCCL's documented rules (nccl_fabric.h has the wires):
//   - ncclCommInitRank is collective and blocks until every rank joined;
//   - operations between ncclGroupStart and ncclGroupEnd are launched together, as one kernel
//     on the stream, and progress together (a send/recv pair inside one group cannot deadlock);
//     the kernel counts in the serial-kernels stress mode like any other;
//   - connections are made lazily inside the first ncclGroupEnd that talks to a peer, which
//     blocks the host while the peer is missing;
//   - per communicator, operations run in the order issued; the ranks must issue the same
//     collectives in the same order (a mismatch is reported: NCCL would hang or corrupt);
//   - ncclCommGetAsyncError may be polled from any thread: it reports a mismatch and a peer
//     process that is gone (ncclRemoteError);
//   - ncclCommAbort makes the communicator's pending kernels return; afterwards the
//     communicator must not be used: a call on it is reported (NCCL would touch freed memory).
// NF_EMU_NCCL_ABORT_HANGS=1 makes ncclCommAbort never return, as NCCL issue 992 describes.
//
// Reductions accumulate in the rank order 0, 1, ..., in fp32 for fp16 and bf16 (rounded once:
// NCCL rounds at every hop of its ring), natively for the other types.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nccl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/emulation/devices.h"
#include "tests/emulation/nccl_fabric.h"
#include "tests/emulation/streams.h"

struct ncclComm {
  nf::emu::Fabric* fabric = nullptr;
  int rank = 0, nranks = 0, device = 0;
  std::atomic<bool> aborted{false}, dead{false};
  std::atomic<int> async_error{ncclSuccess};
  std::atomic<int> in_flight{0};
  // Issue order, on the host thread that drives the communicator:
  uint64_t next_ticket = 0;  // collective chunks
  uint64_t sends[nf::emu::kMaxNcclRanks] = {}, receives[nf::emu::kMaxNcclRanks] = {};
  bool connected[nf::emu::kMaxNcclRanks] = {};
  std::mutex error_mutex;
  std::string last_error;
};

namespace nf::emu {
namespace {

size_t ElementBytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

bool ValidType(ncclDataType_t type) { return type >= ncclInt8 && type <= ncclBfloat16; }

// One operation of a group as issued, and its progress through the fabric.
struct GroupOp {
  enum class Kind { kCollective, kSend, kRecv } kind;
  ncclComm* comm = nullptr;
  cudaStream_t stream = nullptr;
  CollectiveMeta meta{};
  const unsigned char* send = nullptr;
  unsigned char* recv = nullptr;
  size_t element_bytes = 0;
  int peer = 0;
  uint64_t bytes = 0;  // send/recv
  // Assigned at ncclGroupEnd, in issue order:
  uint64_t first_ticket = 0, chunks = 1, message = 0;
  // Progress:
  uint64_t chunk = 0, offset = 0;
  int phase = 0;
  bool done = false;
};

thread_local int group_depth = 0;
thread_local std::vector<GroupOp> group_ops;

void SetError(ncclComm* comm, ncclResult_t error, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(comm->error_mutex);
    if (comm->last_error.empty()) comm->last_error = what;
  }
  int expected = ncclSuccess;
  comm->async_error.compare_exchange_strong(expected, error);
  AddReport(absl::StrCat("NCCL rank ", comm->rank, " of ", comm->nranks, ": ", what));
}

// A call on a communicator that was aborted or destroyed.
bool Dead(ncclComm* comm, const char* call) {
  if (comm == nullptr) return true;
  if (!comm->dead.load()) return false;
  AddReport(absl::StrCat(call, " on a communicator after ncclCommAbort or ncclCommDestroy (rank ",
                         comm->rank, "): NCCL would use freed memory"));
  return true;
}

// ---- Reductions -------------------------------------------------------------------------------

template <typename T>
double LoadAs(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  if constexpr (!std::is_same_v<T, __half> && !std::is_same_v<T, __nv_bfloat16>) {
    return static_cast<double>(v);
  }
}

template <typename T, typename Acc>
void ReduceTyped(const std::vector<const unsigned char*>& inputs, unsigned char* out,
                 uint64_t count, ncclRedOp_t op, int nranks) {
  for (uint64_t i = 0; i < count; ++i) {
    Acc acc{};
    for (size_t r = 0; r < inputs.size(); ++r) {
      Acc v;
      if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
        v = static_cast<Acc>(LoadAs<T>(inputs[r] + i * sizeof(T)));
      } else {
        T raw;
        std::memcpy(&raw, inputs[r] + i * sizeof(T), sizeof(T));
        v = static_cast<Acc>(raw);
      }
      if (r == 0) {
        acc = v;
      } else if (op == ncclSum || op == ncclAvg) {
        acc = acc + v;
      } else if (op == ncclProd) {
        acc = acc * v;
      } else if (op == ncclMax) {
        acc = v > acc ? v : acc;
      } else {
        acc = v < acc ? v : acc;
      }
    }
    if (op == ncclAvg) acc = acc / static_cast<Acc>(nranks);
    T result;
    if constexpr (std::is_same_v<T, __half>) {
      result = __float2half_rn(static_cast<float>(acc));
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      result = __float2bfloat16_rn(static_cast<float>(acc));
    } else {
      result = static_cast<T>(acc);
    }
    std::memcpy(out + i * sizeof(T), &result, sizeof(T));
  }
}

void Reduce(const std::vector<const unsigned char*>& inputs, unsigned char* out, uint64_t count,
            ncclDataType_t type, ncclRedOp_t op, int nranks) {
  switch (type) {
    case ncclInt8:
      return ReduceTyped<int8_t, int8_t>(inputs, out, count, op, nranks);
    case ncclUint8:
      return ReduceTyped<uint8_t, uint8_t>(inputs, out, count, op, nranks);
    case ncclInt32:
      return ReduceTyped<int32_t, int32_t>(inputs, out, count, op, nranks);
    case ncclUint32:
      return ReduceTyped<uint32_t, uint32_t>(inputs, out, count, op, nranks);
    case ncclInt64:
      return ReduceTyped<int64_t, int64_t>(inputs, out, count, op, nranks);
    case ncclUint64:
      return ReduceTyped<uint64_t, uint64_t>(inputs, out, count, op, nranks);
    case ncclFloat16:
      return ReduceTyped<__half, float>(inputs, out, count, op, nranks);
    case ncclBfloat16:
      return ReduceTyped<__nv_bfloat16, float>(inputs, out, count, op, nranks);
    case ncclFloat32:
      return ReduceTyped<float, float>(inputs, out, count, op, nranks);
    default:
      return ReduceTyped<double, double>(inputs, out, count, op, nranks);
  }
}

// ---- Progress (with the fabric locked) --------------------------------------------------------

// Elements of the per-rank count that one chunk moves.
uint64_t ChunkElements(const GroupOp& op) {
  const uint64_t blocks = op.meta.kind == CollectiveKind::kReduceScatter ? op.comm->nranks : 1;
  return std::max<uint64_t>(1, kNcclChunkBytes / (op.element_bytes * blocks));
}

void StepCollective(GroupOp& op) {
  ncclComm& comm = *op.comm;
  FabricHeader& h = comm.fabric->header();
  CollectiveSlot& slot = h.slot;
  const int n = comm.nranks, me = comm.rank;
  const uint64_t per_chunk = ChunkElements(op);
  const uint64_t begin = op.chunk * per_chunk;
  const uint64_t len = std::min(per_chunk, op.meta.count - std::min(op.meta.count, begin));
  const size_t eb = op.element_bytes;
  if (op.phase == 0) {
    if (slot.ticket != op.first_ticket + op.chunk) return;  // an earlier chunk is still there
    if (slot.arrived == 0) {
      slot.meta = op.meta;
    } else if (!(slot.meta == op.meta)) {
      SetError(
          &comm, ncclInvalidUsage,
          absl::StrCat("collective mismatch: this rank issued collective kind ",
                       static_cast<int>(op.meta.kind), " of ", op.meta.count, " elements (type ",
                       op.meta.type, ", op ", op.meta.op, ") where another rank issued kind ",
                       static_cast<int>(slot.meta.kind), " of ", slot.meta.count,
                       " elements (type ", slot.meta.type, ", op ", slot.meta.op,
                       "): every rank must issue the same collectives in the "
                       "same order"));
      h.mismatched = 1;
      op.done = true;
      return;
    }
    unsigned char* region = comm.fabric->region(me);
    switch (op.meta.kind) {
      case CollectiveKind::kAllReduce:
      case CollectiveKind::kAllGather:
        std::memcpy(region, op.send + begin * eb, len * eb);
        break;
      case CollectiveKind::kBroadcast:
        if (me == op.meta.root) std::memcpy(region, op.send + begin * eb, len * eb);
        break;
      case CollectiveKind::kReduceScatter:
        for (int b = 0; b < n; ++b) {
          std::memcpy(region + b * len * eb, op.send + (b * op.meta.count + begin) * eb, len * eb);
        }
        break;
    }
    ++slot.arrived;
    op.phase = 1;
    comm.fabric->Broadcast();
  }
  if (op.phase == 1) {
    if (slot.arrived < n) return;
    std::vector<const unsigned char*> regions(n);
    for (int r = 0; r < n; ++r) regions[r] = comm.fabric->region(r);
    const auto type = static_cast<ncclDataType_t>(op.meta.type);
    const auto red = static_cast<ncclRedOp_t>(op.meta.op);
    switch (op.meta.kind) {
      case CollectiveKind::kAllReduce:
        Reduce(regions, op.recv + begin * eb, len, type, red, n);
        break;
      case CollectiveKind::kBroadcast:
        std::memcpy(op.recv + begin * eb, regions[op.meta.root], len * eb);
        break;
      case CollectiveKind::kAllGather:
        for (int r = 0; r < n; ++r) {
          std::memcpy(op.recv + (r * op.meta.count + begin) * eb, regions[r], len * eb);
        }
        break;
      case CollectiveKind::kReduceScatter: {
        std::vector<const unsigned char*> blocks(n);
        for (int r = 0; r < n; ++r) blocks[r] = regions[r] + me * len * eb;
        Reduce(blocks, op.recv + begin * eb, len, type, red, n);
        break;
      }
    }
    if (++slot.departed == n) {
      slot.arrived = slot.departed = 0;
      ++slot.ticket;
    }
    comm.fabric->Broadcast();
    op.phase = 0;
    if (++op.chunk == op.chunks) op.done = true;
  }
}

void StepSend(GroupOp& op) {
  ncclComm& comm = *op.comm;
  Channel& ch = comm.fabric->header().channels[comm.rank][op.peer];
  if (op.phase == 0) {  // rendezvous: the receive must be posted
    if (ch.receives_posted <= op.message) return;
    op.phase = 1;
  }
  if (op.phase == 1) {
    if (ch.full) return;
    const uint64_t len = std::min<uint64_t>(kNcclChunkBytes, op.bytes - op.offset);
    std::memcpy(comm.fabric->channel_buffer(comm.rank, op.peer), op.send + op.offset, len);
    ch.message = op.message;
    ch.message_bytes = op.bytes;
    ch.offset = op.offset;
    ch.bytes = len;
    ch.full = true;
    op.offset += len;
    comm.fabric->Broadcast();
    if (op.offset == op.bytes) op.phase = 2;
    return;
  }
  if (!ch.full) op.done = true;  // the last chunk was taken
}

void StepRecv(GroupOp& op) {
  ncclComm& comm = *op.comm;
  Channel& ch = comm.fabric->header().channels[op.peer][comm.rank];
  if (op.phase == 0) {
    ch.receives_posted = op.message + 1;
    op.phase = 1;
    comm.fabric->Broadcast();
  }
  if (!ch.full || ch.message != op.message) return;
  if (ch.message_bytes != op.bytes) {
    SetError(&comm, ncclInvalidUsage,
             absl::StrCat("rank ", op.peer, " sends ", ch.message_bytes, " bytes to rank ",
                          comm.rank, ", whose matching receive takes ", op.bytes));
    comm.fabric->header().mismatched = 1;
    op.done = true;
    return;
  }
  std::memcpy(op.recv + ch.offset, comm.fabric->channel_buffer(op.peer, comm.rank), ch.bytes);
  op.offset = ch.offset + ch.bytes;
  ch.full = false;
  comm.fabric->Broadcast();
  if (op.offset == op.bytes) op.done = true;
}

// The kernel of one group on one communicator: runs until every operation is done or the
// communicator is aborted.
void RunGroup(std::vector<GroupOp>& ops) {
  ncclComm& comm = *ops.front().comm;
  comm.fabric->Lock();
  while (!comm.aborted.load()) {
    if (comm.fabric->header().mismatched != 0) {
      if (comm.async_error.load() == ncclSuccess) {
        SetError(&comm, ncclInvalidUsage,
                 "another rank's operations do not match this rank's (see its report)");
      }
      break;
    }
    bool all_done = true;
    for (GroupOp& op : ops) {
      if (op.done) continue;
      switch (op.kind) {
        case GroupOp::Kind::kCollective:
          StepCollective(op);
          break;
        case GroupOp::Kind::kSend:
          StepSend(op);
          break;
        case GroupOp::Kind::kRecv:
          StepRecv(op);
          break;
      }
      all_done = all_done && op.done;
    }
    if (all_done) break;
    comm.fabric->Wait();
  }
  comm.fabric->Unlock();
}

std::atomic<int> hosts_connecting{0};

// Inside ncclGroupEnd: each side marks its half of the connection and waits for the other's.
ncclResult_t Connect(ncclComm* comm, int peer) {
  if (comm->connected[peer]) return ncclSuccess;
  FabricHeader& h = comm->fabric->header();
  comm->fabric->Lock();
  h.connect[comm->rank][peer] = 1;
  comm->fabric->Broadcast();
  ++hosts_connecting;
  while (h.connect[peer][comm->rank] == 0 && !comm->aborted.load()) comm->fabric->Wait();
  --hosts_connecting;
  comm->fabric->Unlock();
  if (comm->aborted.load()) return ncclInvalidUsage;
  comm->connected[peer] = true;
  return ncclSuccess;
}

ncclResult_t Launch(std::vector<GroupOp> ops) {
  // Sequence numbers in issue order, then connections, then one kernel per communicator and
  // stream.
  for (GroupOp& op : ops) {
    ncclComm* comm = op.comm;
    if (op.kind == GroupOp::Kind::kCollective) {
      op.chunks =
          std::max<uint64_t>(1, (op.meta.count + ChunkElements(op) - 1) / ChunkElements(op));
      op.first_ticket = comm->next_ticket;
      comm->next_ticket += op.chunks;
    } else if (op.kind == GroupOp::Kind::kSend) {
      op.message = comm->sends[op.peer]++;
    } else {
      op.message = comm->receives[op.peer]++;
    }
  }
  for (GroupOp& op : ops) {
    if (op.kind == GroupOp::Kind::kCollective) {
      for (int peer = 0; peer < op.comm->nranks; ++peer) {
        if (peer == op.comm->rank) continue;
        if (const ncclResult_t r = Connect(op.comm, peer); r != ncclSuccess) return r;
      }
    } else if (const ncclResult_t r = Connect(op.comm, op.peer); r != ncclSuccess) {
      return r;
    }
  }
  std::map<std::pair<ncclComm*, cudaStream_t>, std::vector<GroupOp>> kernels;
  for (GroupOp& op : ops) kernels[{op.comm, op.stream}].push_back(op);
  for (auto& [key, kernel_ops] : kernels) {
    auto [comm, stream_handle] = key;
    Stream* stream = StreamOf(stream_handle);
    if (stream == nullptr) return ncclInvalidArgument;
    Operation op;
    op.is_kernel = true;
    op.what = absl::StrCat("NCCL kernel of ", kernel_ops.size(), " operation(s) on rank ",
                           comm->rank, " of ", comm->nranks);
    for (const GroupOp& g : kernel_ops) {
      if (g.send != nullptr) op.accesses.push_back({g.send, false});
      if (g.recv != nullptr) op.accesses.push_back({g.recv, true});
    }
    auto shared = std::make_shared<std::vector<GroupOp>>(std::move(kernel_ops));
    ++comm->in_flight;
    op.run = [shared, comm] {
      RunGroup(*shared);
      --comm->in_flight;
    };
    if (Enqueue(stream, std::move(op)) != cudaSuccess) {
      --comm->in_flight;
      return ncclUnhandledCudaError;
    }
  }
  return ncclSuccess;
}

ncclResult_t Issue(GroupOp op) {
  if (Dead(op.comm, "an NCCL operation")) return ncclInvalidUsage;
  if (op.comm->aborted.load()) return ncclInvalidUsage;
  group_ops.push_back(std::move(op));
  if (group_depth > 0) return ncclSuccess;
  std::vector<GroupOp> ops = std::move(group_ops);
  group_ops.clear();
  return Launch(std::move(ops));
}

ncclResult_t Collective(CollectiveKind kind, const void* send, void* recv, size_t count,
                        ncclDataType_t type, int op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  if (comm == nullptr || !ValidType(type) ||
      (count > 0 && (send == nullptr && kind != CollectiveKind::kBroadcast))) {
    return ncclInvalidArgument;
  }
  if (kind == CollectiveKind::kBroadcast && (root < 0 || root >= comm->nranks)) {
    return ncclInvalidArgument;
  }
  GroupOp g;
  g.kind = GroupOp::Kind::kCollective;
  g.comm = comm;
  g.stream = stream;
  g.meta = {kind, count, static_cast<int32_t>(type), op, root};
  g.send = static_cast<const unsigned char*>(send);
  g.recv = static_cast<unsigned char*>(recv);
  g.element_bytes = ElementBytes(type);
  return Issue(g);
}

ncclResult_t PointToPoint(GroupOp::Kind kind, const void* send, void* recv, size_t count,
                          ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr || !ValidType(type) || peer < 0 || peer >= comm->nranks ||
      peer == comm->rank) {
    return ncclInvalidArgument;
  }
  GroupOp g;
  g.kind = kind;
  g.comm = comm;
  g.stream = stream;
  g.send = static_cast<const unsigned char*>(send);
  g.recv = static_cast<unsigned char*>(recv);
  g.element_bytes = ElementBytes(type);
  g.bytes = count * g.element_bytes;
  g.peer = peer;
  return Issue(g);
}

void WaitIdle(ncclComm* comm) {
  while (comm->in_flight.load() > 0) {
    comm->fabric->Lock();
    comm->fabric->Broadcast();
    comm->fabric->Unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

int NcclHostsConnecting() { return hosts_connecting.load(); }

}  // namespace nf::emu

using nf::emu::CollectiveKind;
using nf::emu::GroupOp;

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::string name;
  if (!nf::emu::Fabric::Create(&name)) return ncclSystemError;
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, name.data(), std::min(name.size(), sizeof(id->internal) - 1));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (out == nullptr || nranks < 1 || nranks > nf::emu::kMaxNcclRanks || rank < 0 ||
      rank >= nranks) {
    return ncclInvalidArgument;
  }
  id.internal[sizeof(id.internal) - 1] = '\0';
  nf::emu::Fabric* fabric = nf::emu::Fabric::Open(id.internal);
  if (fabric == nullptr) return ncclInvalidArgument;  // not an id of ncclGetUniqueId
  nf::emu::FabricHeader& h = fabric->header();
  fabric->Lock();
  if (h.nranks == 0) h.nranks = nranks;
  if (h.nranks != nranks || h.pids[rank] != 0) {
    fabric->Unlock();
    return ncclInvalidArgument;
  }
  h.pids[rank] = getpid();
  ++h.joined;
  fabric->Broadcast();
  // Collective: blocks until every rank joined (no deadline: NCCL has none either).
  while (h.joined < nranks) fabric->Wait();
  fabric->Unlock();
  if (rank == 0) fabric->Unlink();  // every rank has it mapped
  auto* comm = new ncclComm();
  comm->fabric = fabric;
  comm->rank = rank;
  comm->nranks = nranks;
  comm->device = nf::emu::CurrentDevice();
  *out = comm;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (nf::emu::Dead(comm, "ncclCommDestroy")) return ncclInvalidUsage;
  nf::emu::WaitIdle(comm);
  comm->dead = true;  // never freed: a late call is reported instead of touching freed memory
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (nf::emu::Dead(comm, "ncclCommAbort")) return ncclInvalidUsage;
  if (const char* hang = std::getenv("NF_EMU_NCCL_ABORT_HANGS");
      hang != nullptr && hang[0] == '1') {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  comm->aborted = true;
  nf::emu::WaitIdle(comm);
  comm->dead = true;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (error == nullptr) return ncclInvalidArgument;
  if (nf::emu::Dead(comm, "ncclCommGetAsyncError")) return ncclInvalidUsage;
  // A peer process that is gone: what NCCL's proxy sees as a closed connection.
  nf::emu::FabricHeader& h = comm->fabric->header();
  for (int r = 0; r < comm->nranks; ++r) {
    const pid_t pid = h.pids[r];
    if (pid != 0 && pid != getpid() && kill(pid, 0) != 0 && errno == ESRCH) {
      nf::emu::SetError(comm, ncclRemoteError,
                        absl::StrCat("rank ", r, " (process ", pid, ") is gone"));
      break;
    }
  }
  *error = static_cast<ncclResult_t>(comm->async_error.load());
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++nf::emu::group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (nf::emu::group_depth == 0) return ncclInvalidUsage;
  if (--nf::emu::group_depth > 0) return ncclSuccess;
  std::vector<GroupOp> ops = std::move(nf::emu::group_ops);
  nf::emu::group_ops.clear();
  return ops.empty() ? ncclSuccess : nf::emu::Launch(std::move(ops));
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return nf::emu::Collective(CollectiveKind::kAllReduce, send, recv, count, type, op, 0, comm,
                             stream);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return nf::emu::Collective(CollectiveKind::kBroadcast, send, recv, count, type, ncclSum, root,
                             comm, stream);
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return nf::emu::Collective(CollectiveKind::kAllGather, send, recv, count, type, ncclSum, 0, comm,
                             stream);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return nf::emu::Collective(CollectiveKind::kReduceScatter, send, recv, count, type, op, 0, comm,
                             stream);
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return nf::emu::PointToPoint(GroupOp::Kind::kSend, send, nullptr, count, type, peer, comm,
                               stream);
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return nf::emu::PointToPoint(GroupOp::Kind::kRecv, nullptr, recv, count, type, peer, comm,
                               stream);
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (comm == nullptr) return "";
  std::lock_guard<std::mutex> lock(comm->error_mutex);
  return comm->last_error.c_str();
}
