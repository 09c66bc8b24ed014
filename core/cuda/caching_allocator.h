// A caching allocator for one GPU: blocks freed by tensors go to a free list keyed by their
// rounded size and are handed out again without cudaMalloc/cudaFree, which synchronise the
// device and cost tens of microseconds. A training step allocates the same sizes every
// micro-batch, so after the first step every request is a cache hit.
//
// Every kernel runs on the context's one compute stream, so a block freed on the host can be
// reused at once: work that still reads it was enqueued earlier on the same stream. Work on
// other streams (NCCL) keeps its tensors alive until the compute stream has waited for it
// (the communicator's handles do that), so the rule holds there too.
//
// Sizes round up to 512 bytes below 1 MiB and to 2 MiB above, so near-equal requests share
// blocks. When cudaMalloc fails the cache is released and the request tried once more; a
// second failure is an error giving the request, the bytes in use and the device's total.
//
// Communication in flight. Releasing the cache means cudaFree, which waits for the whole device,
// NCCL's kernels included, and those may be waiting for a peer (a lost rank, a collective another
// rank has not issued yet): a clear out-of-memory would become a hang that the collective
// watchdog reports as a peer hung, and the job be requeued again and again. So while any
// communication is outstanding on the device (the NCCL communicator counts its operations here,
// from issue until seen complete), a failed cudaMalloc is ResourceExhausted at once, saying so,
// without releasing the cache. core may not know the communicators (parallel/ is above it):
// the count lives here and parallel/ adds to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "core/allocator.h"

namespace nf::cuda {

// Operations of communication libraries issued on `device` and not yet seen complete. Any thread.
void AddOutstandingCommunication(int device, int64_t delta);
int64_t OutstandingCommunication(int device);

struct AllocatorStats {
  size_t allocated_bytes = 0;       // held by live tensors (rounded sizes)
  size_t reserved_bytes = 0;        // obtained from cudaMalloc: allocated + cached
  size_t peak_allocated_bytes = 0;  // since creation or ResetPeak()
  int64_t cuda_mallocs = 0;         // cache misses
};

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(int device) : device_(device) {}
  ~CachingAllocator() override;  // returns cached blocks to the driver
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  Device device() const override { return Device::Cuda(device_); }
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Deallocate(void* ptr, size_t bytes) override;

  AllocatorStats stats() const;
  void ResetPeak();
  // Frees every cached block (after the device has finished with them).
  void ReleaseCache();

  static size_t RoundedSize(size_t bytes);

 private:
  void ReleaseCacheLocked();

  const int device_;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> free_blocks_;  // rounded size -> block
  AllocatorStats stats_;
};

}  // namespace nf::cuda
