// The emulated GPU's execution model: every thread of every block of a kernel runs, each as a
// fiber of its own (Boost.Context), on the host thread that executes the launch's stream.
// Blocks run one after another; the threads of a block run until they block (__syncthreads, a
// warp intrinsic) or exit, in the launch's thread order (forward, reverse or a seeded shuffle),
// round after round. A kernel whose results depend on that order has a race between its
// threads, as compute-sanitizer's racecheck would report: the emulated kernel tests run each
// launch under every order and compare the bits.
//
// CUDA's rules are enforced as errors that name the kernel, the launch and the block:
//   - a __syncthreads that some threads of the block never reach (they exited), or threads
//     waiting at two different __syncthreads;
//   - a warp intrinsic (__shfl*_sync, __any_sync, __all_sync, __ballot_sync, __syncwarp) whose
//     mask names a lane that does not exist, has exited or waits elsewhere, or lanes of one
//     mask arriving at different intrinsics or with different masks;
//   - reading a lane outside the mask.
// Static __shared__ variables are the executing host thread's own (thread_local), so every
// block of a launch sees its own copy; dynamic shared memory is a per-block buffer filled with
// 0xff bytes (a float NaN) so that a read before any write shows in the results.
#pragma once

#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>

namespace nf::emu {

// The order in which the runnable threads of a block (and the blocks of a grid) run.
enum class ThreadOrder { kForward, kReverse, kShuffle };

struct OrderSetting {
  ThreadOrder order = ThreadOrder::kForward;
  uint64_t seed = 1;  // for kShuffle
};
std::string OrderName(const OrderSetting& setting);

// The built-in variables device code reads (threadIdx, blockIdx, blockDim, gridDim).
struct KernelBuiltins {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};

// One launch as the executor runs it: the kernel's parameters, already converted to the
// kernel's parameter types (as CUDA copies them), and a function that calls the kernel with
// them.
struct KernelBody {
  std::shared_ptr<const void> params;
  void (*run)(const void* params) = nullptr;
};

struct LaunchSite {
  std::string kernel;          // the kernel's name with its template arguments
  std::source_location where;  // the launch in the source
};

// "core/cuda/x.cu:12": a place in the sources, from the repository root.
std::string SourcePlace(const std::source_location& where);

// Runs every block of the grid. Returns an empty string, or the first rule violation as one
// line naming the kernel, the launch and the block.
std::string RunGrid(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                    const KernelBody& body, const OrderSetting& order);

// Inside a kernel thread: its built-ins, its block's dynamic shared memory, and the
// synchronisation primitives the device prelude's intrinsics are made of.
const KernelBuiltins& Builtins();
void* DynamicSharedMemory();
void SyncThreads(std::source_location where);

enum class WarpOp { kShuffle, kShuffleXor, kShuffleDown, kShuffleUp, kAny, kAll, kBallot, kSync };
// The lane's part of a warp operation: `value` (up to 8 bytes) and `arg` (source lane, lane
// mask or delta); returns the result bits for this lane once every lane of `mask` arrived.
uint64_t WarpExchange(WarpOp op, uint32_t mask, uint64_t value, int arg, int width,
                      std::source_location where);

}  // namespace nf::emu
