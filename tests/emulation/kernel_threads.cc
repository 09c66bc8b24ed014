#include "tests/emulation/kernel_threads.h"

#include <sys/mman.h>

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace nf::emu {
namespace {

namespace ctx = boost::context;

constexpr int kWarpSize = 32;
// A kernel thread's stack: kernels keep a few small arrays and the call chain of their
// __device__ helpers; a guard page below turns an overflow into a fault, not a corruption.
constexpr size_t kStackBytes = size_t{128} << 10;
constexpr size_t kGuardBytes = 4096;

// Stacks are reused across blocks and launches by the host thread that ran them: a block of
// 1024 threads would otherwise map and unmap 1024 stacks.
class StackPool {
 public:
  ~StackPool() {
    for (void* base : free_) munmap(base, kStackBytes + kGuardBytes);
  }
  ctx::stack_context allocate() {
    void* base;
    if (free_.empty()) {
      base = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (base == MAP_FAILED) {
        std::fprintf(stderr, "nf-emu: cannot map a kernel thread's stack\n");
        std::abort();
      }
      mprotect(base, kGuardBytes, PROT_NONE);
    } else {
      base = free_.back();
      free_.pop_back();
    }
    ctx::stack_context stack;
    stack.size = kStackBytes;
    stack.sp = static_cast<char*>(base) + kGuardBytes + kStackBytes;
    return stack;
  }
  void deallocate(ctx::stack_context& stack) {
    free_.push_back(static_cast<char*>(stack.sp) - kStackBytes - kGuardBytes);
  }

 private:
  std::vector<void*> free_;
};
thread_local StackPool stack_pool;

// Boost.Context's stack-allocator concept over the pool.
struct PooledStack {
  ctx::stack_context allocate() { return stack_pool.allocate(); }
  void deallocate(ctx::stack_context& stack) { stack_pool.deallocate(stack); }
};

enum class ThreadState { kRunnable, kAtBarrier, kAtWarpOp, kExited };

struct ThreadSlot {
  KernelBuiltins builtins;
  int linear = 0;  // x + y * Dx + z * Dx * Dy
  ThreadState state = ThreadState::kRunnable;
  std::source_location waiting_at;  // the barrier or intrinsic it waits at
  ctx::fiber self;                  // the thread while it is suspended
  ctx::fiber scheduler;             // inside the thread: the way back to the block's scheduler
};

// The warp operation the lanes of one warp are gathering at.
struct WarpRendezvous {
  bool open = false;
  WarpOp op = WarpOp::kSync;
  uint32_t mask = 0;
  int width = kWarpSize;
  std::source_location where;
  uint32_t arrived = 0;
  uint64_t values[kWarpSize] = {};
  int args[kWarpSize] = {};
  uint64_t results[kWarpSize] = {};
};

const char* OpName(WarpOp op) {
  switch (op) {
    case WarpOp::kShuffle:
      return "__shfl_sync";
    case WarpOp::kShuffleXor:
      return "__shfl_xor_sync";
    case WarpOp::kShuffleDown:
      return "__shfl_down_sync";
    case WarpOp::kShuffleUp:
      return "__shfl_up_sync";
    case WarpOp::kAny:
      return "__any_sync";
    case WarpOp::kAll:
      return "__all_sync";
    case WarpOp::kBallot:
      return "__ballot_sync";
    case WarpOp::kSync:
      return "__syncwarp";
  }
  return "?";
}

}  // namespace

std::string SourcePlace(const std::source_location& where) {
  std::string file = where.file_name();
  // From the repository root, however the build named the file.
  for (const char* root : {"core/", "tests/"}) {
    if (const size_t at = file.rfind(root); at != std::string::npos) {
      file = file.substr(at);
      break;
    }
  }
  return absl::StrCat(file, ":", where.line());
}

namespace {

// Two places in the sources are one; file names of one translation unit share their pointer.
bool SamePlace(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         (a.file_name() == b.file_name() || std::strcmp(a.file_name(), b.file_name()) == 0);
}

std::string Dim(const dim3& d) { return absl::StrCat("(", d.x, ",", d.y, ",", d.z, ")"); }
std::string Dim(const uint3& d) { return absl::StrCat("(", d.x, ",", d.y, ",", d.z, ")"); }

class Block;
thread_local Block* current_block = nullptr;
thread_local ThreadSlot* current_thread = nullptr;

// One block of a launch: its threads, its warps' rendezvous, its shared memory and the
// scheduler that runs them.
class Block {
 public:
  Block(const LaunchSite& site, dim3 grid, dim3 block, uint3 block_idx, void* dynamic_shared,
        const KernelBody& body, const OrderSetting& order, uint64_t block_number)
      : site_(site),
        grid_(grid),
        block_(block),
        block_idx_(block_idx),
        dynamic_shared_(dynamic_shared),
        body_(body),
        order_(order),
        rng_(order.seed * 0x9e3779b97f4a7c15ull + block_number) {
    const int n = static_cast<int>(block.x * block.y * block.z);
    threads_.resize(n);
    warps_.resize((n + kWarpSize - 1) / kWarpSize);
    for (int t = 0; t < n; ++t) {
      ThreadSlot& slot = threads_[t];
      slot.linear = t;
      slot.builtins.thread_idx = {static_cast<unsigned>(t % block.x),
                                  static_cast<unsigned>(t / block.x % block.y),
                                  static_cast<unsigned>(t / (block.x * block.y))};
      slot.builtins.block_idx = block_idx;
      slot.builtins.block_dim = block;
      slot.builtins.grid_dim = grid;
    }
  }

  std::string Run() {
    const int n = static_cast<int>(threads_.size());
    std::vector<int> order(n);
    for (int t = 0; t < n; ++t) order[t] = order_.order == ThreadOrder::kReverse ? n - 1 - t : t;
    Block* const outer_block = current_block;
    current_block = this;
    while (error_.empty()) {
      ArrangeRound(order);
      bool ran = false;
      for (int t : order) {
        if (threads_[t].state != ThreadState::kRunnable) continue;
        ran = true;
        Resume(threads_[t]);
        if (!error_.empty()) break;
      }
      if (!error_.empty() || AllExited()) break;
      if (!ran || NoneRunnable()) ReleaseBarrierOrReport();
    }
    current_block = outer_block;
    // Suspended fibers (after an error) unwind their stacks as they are destroyed.
    threads_.clear();
    return error_;
  }

  // Called by a kernel thread: park at the block's barrier.
  void Barrier(std::source_location where) {
    ThreadSlot& self = *current_thread;
    self.state = ThreadState::kAtBarrier;
    self.waiting_at = where;
    Suspend(self);
  }

  uint64_t Exchange(WarpOp op, uint32_t mask, uint64_t value, int arg, int width,
                    std::source_location where) {
    ThreadSlot& self = *current_thread;
    const int lane = self.linear % kWarpSize, warp = self.linear / kWarpSize;
    WarpRendezvous& w = warps_[warp];
    const int lanes_in_warp =
        std::min<int>(kWarpSize, static_cast<int>(threads_.size()) - warp * kWarpSize);
    const uint32_t existing = lanes_in_warp == kWarpSize ? ~0u : (1u << lanes_in_warp) - 1;
    if ((mask & (1u << lane)) == 0) {
      Fail(absl::StrCat(OpName(op), " at ", SourcePlace(where), ": lane ", lane, " of warp ", warp,
                        " is not in its own mask 0x", absl::Hex(mask)));
      return value;
    }
    if ((mask & ~existing) != 0) {
      Fail(absl::StrCat(OpName(op), " at ", SourcePlace(where), ": mask 0x", absl::Hex(mask),
                        " names lanes that warp ", warp, " does not have (", lanes_in_warp,
                        " threads: the block size ", Dim(block_), " is not a multiple of 32)"));
      return value;
    }
    if (width <= 0 || width > kWarpSize || (width & (width - 1)) != 0) {
      Fail(absl::StrCat(OpName(op), " at ", SourcePlace(where), ": width ", width,
                        " is not a power of 2 up to 32"));
      return value;
    }
    if (!w.open) {
      w.open = true;
      w.op = op;
      w.mask = mask;
      w.width = width;
      w.where = where;
      w.arrived = 0;
    } else if (w.op != op || w.mask != mask || !SamePlace(w.where, where)) {
      Fail(absl::StrCat("warp ", warp, ": lane ", lane, " is at ", OpName(op), " (mask 0x",
                        absl::Hex(mask), ") at ", SourcePlace(where), " while lanes 0x",
                        absl::Hex(w.arrived), " wait at ", OpName(w.op), " (mask 0x",
                        absl::Hex(w.mask), ") at ", SourcePlace(w.where)));
      return value;
    }
    w.values[lane] = value;
    w.args[lane] = arg;
    w.arrived |= 1u << lane;
    if (w.arrived == w.mask) {
      Complete(w, warp);
      return w.results[lane];
    }
    self.state = ThreadState::kAtWarpOp;
    self.waiting_at = where;
    Suspend(self);
    return w.results[lane];
  }

  void* dynamic_shared() const { return dynamic_shared_; }

 private:
  // The order of one round: fixed for forward and reverse, a new shuffle every round.
  void ArrangeRound(std::vector<int>& order) {
    if (order_.order == ThreadOrder::kShuffle) std::shuffle(order.begin(), order.end(), rng_);
  }

  void Resume(ThreadSlot& slot) {
    ThreadSlot* const outer = current_thread;
    current_thread = &slot;
    if (!slot.self) {
      slot.self = ctx::fiber(std::allocator_arg, PooledStack(), [this, &slot](ctx::fiber&& back) {
        slot.scheduler = std::move(back);
        body_.run(body_.params.get());
        slot.state = ThreadState::kExited;
        return std::move(slot.scheduler);
      });
    }
    slot.self = std::move(slot.self).resume();
    current_thread = outer;
  }

  static void Suspend(ThreadSlot& self) { self.scheduler = std::move(self.scheduler).resume(); }

  void Complete(WarpRendezvous& w, int warp) {
    const int base = warp * kWarpSize;
    for (int lane = 0; lane < kWarpSize; ++lane) {
      if ((w.mask & (1u << lane)) == 0) continue;
      const int segment = lane & ~(w.width - 1);
      int source = lane;
      switch (w.op) {
        case WarpOp::kShuffle:
          source = segment + (w.args[lane] & (w.width - 1));
          break;
        case WarpOp::kShuffleXor:
          source = lane ^ w.args[lane];
          if (source < segment || source >= segment + w.width) source = lane;
          break;
        case WarpOp::kShuffleDown:
          source = lane + w.args[lane];
          if (source >= segment + w.width) source = lane;
          break;
        case WarpOp::kShuffleUp:
          source = lane - w.args[lane];
          if (source < segment) source = lane;
          break;
        default:
          break;
      }
      if (source < 0 || source >= kWarpSize || (w.mask & (1u << source)) == 0) {
        Fail(absl::StrCat(OpName(w.op), " at ", SourcePlace(w.where), ": lane ", lane, " of warp ",
                          warp, " reads lane ", source, ", which is not in the mask 0x",
                          absl::Hex(w.mask)));
        return;
      }
      uint64_t result = w.values[source];
      if (w.op == WarpOp::kAny || w.op == WarpOp::kAll || w.op == WarpOp::kBallot) {
        uint32_t ballot = 0;
        for (int l = 0; l < kWarpSize; ++l) {
          if ((w.mask & (1u << l)) != 0 && w.values[l] != 0) ballot |= 1u << l;
        }
        result = w.op == WarpOp::kBallot ? ballot
                 : w.op == WarpOp::kAny  ? (ballot != 0)
                                         : (ballot == w.mask);
      }
      w.results[lane] = result;
      ThreadSlot& slot = threads_[base + lane];
      if (slot.state == ThreadState::kAtWarpOp) slot.state = ThreadState::kRunnable;
    }
    w.open = false;
  }

  bool AllExited() const {
    return std::all_of(threads_.begin(), threads_.end(),
                       [](const ThreadSlot& t) { return t.state == ThreadState::kExited; });
  }
  bool NoneRunnable() const {
    return std::none_of(threads_.begin(), threads_.end(),
                        [](const ThreadSlot& t) { return t.state == ThreadState::kRunnable; });
  }

  // No thread can run: either the whole block waits at one __syncthreads (release it) or the
  // block can never go on (report why).
  void ReleaseBarrierOrReport() {
    int at_barrier = 0, exited = 0;
    const ThreadSlot* first_at_barrier = nullptr;
    for (const ThreadSlot& t : threads_) {
      if (t.state == ThreadState::kAtWarpOp) {
        const WarpRendezvous& w = warps_[t.linear / kWarpSize];
        std::string missing;
        for (int lane = 0; lane < kWarpSize; ++lane) {
          if ((w.mask & (1u << lane)) == 0 || (w.arrived & (1u << lane)) != 0) continue;
          const ThreadSlot& other = threads_[(t.linear / kWarpSize) * kWarpSize + lane];
          missing = absl::StrCat("lane ", lane,
                                 other.state == ThreadState::kExited
                                     ? std::string(" has exited")
                                     : absl::StrCat(" waits at ", SourcePlace(other.waiting_at)));
          break;
        }
        Fail(absl::StrCat(OpName(w.op), " at ", SourcePlace(w.where), " (mask 0x",
                          absl::Hex(w.mask), ") can never complete in warp ", t.linear / kWarpSize,
                          ": ", missing));
        return;
      }
      if (t.state == ThreadState::kExited) ++exited;
      if (t.state == ThreadState::kAtBarrier) {
        ++at_barrier;
        if (first_at_barrier == nullptr) {
          first_at_barrier = &t;
        } else if (!SamePlace(t.waiting_at, first_at_barrier->waiting_at)) {
          Fail(absl::StrCat("threads wait at two different __syncthreads: thread ",
                            first_at_barrier->linear, " at ",
                            SourcePlace(first_at_barrier->waiting_at), ", thread ", t.linear,
                            " at ", SourcePlace(t.waiting_at)));
          return;
        }
      }
    }
    if (exited > 0) {
      Fail(absl::StrCat("__syncthreads at ", SourcePlace(first_at_barrier->waiting_at),
                        " reached by ", at_barrier, " of ", threads_.size(), " threads; ", exited,
                        " exited without it (a __syncthreads in code some threads skip)"));
      return;
    }
    for (ThreadSlot& t : threads_) t.state = ThreadState::kRunnable;
  }

  void Fail(std::string what) {
    if (!error_.empty()) return;
    error_ =
        absl::StrCat("kernel ", site_.kernel, " launched at ", SourcePlace(site_.where), " (grid ",
                     Dim(grid_), ", block ", Dim(block_), "), block ", Dim(block_idx_), ": ", what);
  }

  const LaunchSite& site_;
  const dim3 grid_, block_;
  const uint3 block_idx_;
  void* const dynamic_shared_;
  const KernelBody& body_;
  const OrderSetting order_;
  std::mt19937_64 rng_;
  std::vector<ThreadSlot> threads_;
  std::vector<WarpRendezvous> warps_;
  std::string error_;
};

}  // namespace

std::string OrderName(const OrderSetting& setting) {
  switch (setting.order) {
    case ThreadOrder::kForward:
      return "forward";
    case ThreadOrder::kReverse:
      return "reverse";
    case ThreadOrder::kShuffle:
      return absl::StrCat("shuffle:", setting.seed);
  }
  return "?";
}

std::string RunGrid(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                    const KernelBody& body, const OrderSetting& order) {
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  std::vector<uint64_t> block_order(blocks);
  for (uint64_t b = 0; b < blocks; ++b) block_order[b] = b;
  if (order.order == ThreadOrder::kReverse) std::reverse(block_order.begin(), block_order.end());
  if (order.order == ThreadOrder::kShuffle) {
    std::mt19937_64 rng(order.seed);
    std::shuffle(block_order.begin(), block_order.end(), rng);
  }
  std::vector<unsigned char> dynamic_shared(dynamic_shared_bytes);
  for (uint64_t b : block_order) {
    const uint3 block_idx = {static_cast<unsigned>(b % grid.x),
                             static_cast<unsigned>(b / grid.x % grid.y),
                             static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y))};
    std::fill(dynamic_shared.begin(), dynamic_shared.end(), 0xff);
    Block run(site, grid, block, block_idx, dynamic_shared.data(), body, order, b);
    std::string error = run.Run();
    if (!error.empty()) return error;
  }
  return "";
}

const KernelBuiltins& Builtins() { return current_thread->builtins; }

void* DynamicSharedMemory() { return current_block->dynamic_shared(); }

void SyncThreads(std::source_location where) { current_block->Barrier(where); }

uint64_t WarpExchange(WarpOp op, uint32_t mask, uint64_t value, int arg, int width,
                      std::source_location where) {
  return current_block->Exchange(op, mask, value, arg, width, where);
}

}  // namespace nf::emu
