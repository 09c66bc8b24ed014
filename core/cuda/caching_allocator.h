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
// Communication in flight (outstanding_communication.h): releasing the cache means cudaFree,
// which waits for the whole device, NCCL's kernels included, and those may wait for peers. So
// after a failed cudaMalloc the allocator waits for the device's communication to complete, at
// most kCommunicationDrainLimit: an overlapped collective of a healthy job completes as soon as
// its peers issue it, and the cache is then released and the request retried as always. Still
// outstanding after the limit (an operation waiting for a peer that waits for this rank, or a
// lost one), the request is ResourceExhausted, saying so, with the cache kept.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "core/allocator.h"

namespace nf::cuda {

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

  // How long a failed cudaMalloc waits for the device's communication to complete before
  // releasing the cache (the header says why).
  static constexpr std::chrono::milliseconds kCommunicationDrainLimit{10'000};

 private:
  void ReleaseCacheLocked();

  const int device_;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> free_blocks_;  // rounded size -> block
  AllocatorStats stats_;
};

}  // namespace nf::cuda
