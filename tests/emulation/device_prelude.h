// Force-included (g++ -include) into every kernel source of core/cuda in the emulated build
// (NF_CUDA_EMULATION): what nvcc provides to device code, for the host compiler. The execution
// qualifiers become plain C++, __shared__ variables the executing host thread's own, the
// built-in variables and intrinsics calls into the emulated GPU (kernel_threads.h), and the
// launch helper of core/cuda/launch.cuh submits to the emulated runtime (kernel_launch.h).
// fp16 and bf16 are CUDA's own types and their host implementations (cuda_fp16.h, cuda_bf16.h).
#pragma once

// The CUDA headers define these only where they are not defined yet (crt/host_defines.h).
#define __global__
#define __device__
#define __host__
// Every block of a launch runs on one host thread, one block after another, so a thread_local
// static is exactly one copy per running block.
#define __shared__ static thread_local

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <type_traits>

#include "tests/emulation/kernel_launch.h"
#include "tests/emulation/kernel_threads.h"

#define threadIdx (::nf::emu::Builtins().thread_idx)
#define blockIdx (::nf::emu::Builtins().block_idx)
#define blockDim (::nf::emu::Builtins().block_dim)
#define gridDim (::nf::emu::Builtins().grid_dim)

inline void __syncthreads(std::source_location where = std::source_location::current()) {
  ::nf::emu::SyncThreads(where);
}
inline void __syncwarp(unsigned mask = 0xffffffffu,
                       std::source_location where = std::source_location::current()) {
  ::nf::emu::WarpExchange(::nf::emu::WarpOp::kSync, mask, 0, 0, 32, where);
}

namespace nf::emu {
template <typename T>
T WarpShuffle(WarpOp op, unsigned mask, T value, int arg, int width, std::source_location where) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = WarpExchange(op, mask, bits, arg, width, where);
  T result;
  std::memcpy(&result, &bits, sizeof(T));
  return result;
}
}  // namespace nf::emu

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32,
              std::source_location where = std::source_location::current()) {
  return ::nf::emu::WarpShuffle(::nf::emu::WarpOp::kShuffle, mask, var, src_lane, width, where);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,
                  std::source_location where = std::source_location::current()) {
  return ::nf::emu::WarpShuffle(::nf::emu::WarpOp::kShuffleXor, mask, var, lane_mask, width, where);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                   std::source_location where = std::source_location::current()) {
  return ::nf::emu::WarpShuffle(::nf::emu::WarpOp::kShuffleDown, mask, var, static_cast<int>(delta),
                                width, where);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                 std::source_location where = std::source_location::current()) {
  return ::nf::emu::WarpShuffle(::nf::emu::WarpOp::kShuffleUp, mask, var, static_cast<int>(delta),
                                width, where);
}
inline int __any_sync(unsigned mask, int predicate,
                      std::source_location where = std::source_location::current()) {
  return static_cast<int>(
      ::nf::emu::WarpExchange(::nf::emu::WarpOp::kAny, mask, predicate != 0, 0, 32, where));
}
inline int __all_sync(unsigned mask, int predicate,
                      std::source_location where = std::source_location::current()) {
  return static_cast<int>(
      ::nf::emu::WarpExchange(::nf::emu::WarpOp::kAll, mask, predicate != 0, 0, 32, where));
}
inline unsigned __ballot_sync(unsigned mask, int predicate,
                              std::source_location where = std::source_location::current()) {
  return static_cast<unsigned>(
      ::nf::emu::WarpExchange(::nf::emu::WarpOp::kBallot, mask, predicate != 0, 0, 32, where));
}

// Atomics: atomic per address, as on the device (blocks of concurrent streams run on
// different host threads).
namespace nf::emu {
template <typename T>
T CompareAndSwap(T* address, T compare, T value) {
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, value);
  return compare;
}
}  // namespace nf::emu
inline int atomicCAS(int* address, int compare, int value) {
  return ::nf::emu::CompareAndSwap(address, compare, value);
}
inline unsigned atomicCAS(unsigned* address, unsigned compare, unsigned value) {
  return ::nf::emu::CompareAndSwap(address, compare, value);
}
inline unsigned long long atomicCAS(unsigned long long* address, unsigned long long compare,
                                    unsigned long long value) {
  return ::nf::emu::CompareAndSwap(address, compare, value);
}
template <typename T>
T atomicAdd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_add(value);
}
template <typename T>
T atomicExch(T* address, T value) {
  return std::atomic_ref<T>(*address).exchange(value);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// Device math without a host counterpart of the same name. The fast intrinsics (__expf) are
// less accurate on the device than expf; the tests' tolerances cover either.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
using std::max;
using std::min;
