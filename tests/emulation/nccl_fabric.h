// The wires of the emulated NCCL (nccl.cc): one POSIX shared-memory segment per communicator,
// named by its ncclUniqueId, so that ranks meet whether they are threads of one process
// (tests/gpu/nccl_threads_test.cc) or processes under mpirun (nf-launch). Device memory is
// process-local, so every transfer goes through the segment in chunks.
//
// Everything in the segment is guarded by one process-shared, robust mutex (a rank killed
// while holding it does not stop the others) and one condition variable that every change
// broadcasts. Waiters wake at least every 20 ms to see their own process's abort flags.
//
//   Membership   ncclCommInitRank registers the rank and blocks until all nranks joined.
//   Connections  made lazily, the first time a group talks to a peer (NCCL_RUNTIME_CONNECT):
//                each side marks its half and the host blocks inside ncclGroupEnd until the
//                peer's half is there.
//   Collectives  one slot: each rank copies its chunk into its region, waits until all ranks
//                did, computes its output from the regions in rank order, and leaves; the slot
//                moves to the next chunk when all left. Ranks must issue the same collectives
//                in the same order (checked: kind, count, type, operator, root).
//   Send/recv    a channel per ordered pair of ranks; the n-th send to a peer matches its n-th
//                receive from this rank. Rendezvous: no byte moves until the receiver posted
//                the receive, and a send completes once its last chunk was taken (NCCL's
//                behaviour above its eager threshold, which programs must not rely on being
//                lower).
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace nf::emu {

inline constexpr int kMaxNcclRanks = 8;
inline constexpr size_t kNcclChunkBytes = size_t{256} << 10;

enum class CollectiveKind : int32_t { kAllReduce, kBroadcast, kAllGather, kReduceScatter };

struct CollectiveMeta {
  CollectiveKind kind;
  uint64_t count;  // elements per rank (all-gather: sent; reduce-scatter: received)
  int32_t type, op, root;
  bool operator==(const CollectiveMeta&) const = default;
};

struct CollectiveSlot {
  uint64_t ticket;  // the chunk of the communicator's collective sequence now in the slot
  int32_t arrived, departed;
  CollectiveMeta meta;
  uint64_t chunk_begin, chunk_elements;  // the chunk within the per-rank count
};

struct Channel {
  uint64_t receives_posted;  // by the receiver, in issue order
  uint64_t message;          // the message whose chunk is in the buffer
  uint64_t message_bytes;    // its total size, as the sender gives it
  uint64_t offset, bytes;    // the chunk
  bool full;
};

struct FabricHeader {
  pthread_mutex_t mutex;
  pthread_cond_t changed;
  uint32_t magic;
  int32_t nranks;  // 0 until the first rank joins
  int32_t joined;
  // A rank found the ranks' operations mismatched (NCCL would hang or corrupt): every rank's
  // pending operations end with the error instead.
  int32_t mismatched;
  pid_t pids[kMaxNcclRanks];
  uint8_t connect[kMaxNcclRanks][kMaxNcclRanks];  // [from][to]: from's half of the connection
  CollectiveSlot slot;
  Channel channels[kMaxNcclRanks][kMaxNcclRanks];  // [from][to]
};

// A mapped segment.
class Fabric {
 public:
  // Creates the segment for a new unique id (ncclGetUniqueId); its name goes into `name`.
  static bool Create(std::string* name);
  // Maps the segment of `name`; nullptr when there is none.
  static Fabric* Open(const std::string& name);

  FabricHeader& header() { return *header_; }
  // Rank r's collective region and the (from, to) channel's buffer, kNcclChunkBytes each.
  unsigned char* region(int rank);
  unsigned char* channel_buffer(int from, int to);

  void Lock();
  void Unlock();
  // Waits for a broadcast or 20 ms, with the lock held.
  void Wait();
  void Broadcast();
  void Unlink();

 private:
  Fabric(std::string name, void* base)
      : name_(std::move(name)), header_(static_cast<FabricHeader*>(base)) {}
  std::string name_;
  FabricHeader* header_;
};

}  // namespace nf::emu
