#include "core/cuda/caching_allocator.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/outstanding_communication.h"

namespace nf::cuda {
namespace {

constexpr size_t kSmallRounding = 512;
constexpr size_t kLargeThreshold = size_t{1} << 20;
constexpr size_t kLargeRounding = size_t{2} << 20;

std::string MiB(size_t bytes) { return absl::StrCat(bytes / (size_t{1} << 20), " MiB"); }

}  // namespace

size_t CachingAllocator::RoundedSize(size_t bytes) {
  const size_t unit = bytes < kLargeThreshold ? kSmallRounding : kLargeRounding;
  return std::max(unit, (bytes + unit - 1) / unit * unit);
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  ReleaseCacheLocked();
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes) {
  const size_t size = RoundedSize(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  void* ptr = nullptr;
  if (auto it = free_blocks_.find(size); it != free_blocks_.end()) {
    ptr = it->second;
    free_blocks_.erase(it);
  } else {
    NF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaError_t error = cudaMalloc(&ptr, size);
    if (error == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky-free error before retrying
      // Other threads' allocations wait meanwhile: the memory they would get is what this one
      // is short of.
      if (!WaitForNoOutstandingCommunication(device_, kCommunicationDrainLimit)) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "out of memory on cuda:", device_, " allocating ", MiB(size), " (", bytes,
            " bytes): tensors hold ", MiB(stats_.allocated_bytes), ", the cache ",
            MiB(stats_.reserved_bytes - stats_.allocated_bytes),
            "; the cache was not released because ", OutstandingCommunication(device_),
            " communication operation(s) were still in flight on the device after ",
            std::chrono::duration_cast<std::chrono::seconds>(kCommunicationDrainLimit).count(),
            " s (cudaFree would wait for them, and they may wait for peers); reduce the "
            "micro-batch size or raise tensor/pipeline parallelism"));
      }
      ReleaseCacheLocked();
      error = cudaMalloc(&ptr, size);
    }
    if (error != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      return absl::ResourceExhaustedError(
          absl::StrCat("out of memory on cuda:", device_, " allocating ", MiB(size), " (", bytes,
                       " bytes): tensors hold ", MiB(stats_.allocated_bytes), " of the device's ",
                       MiB(total_bytes), ", ", MiB(free_bytes),
                       " free; reduce the micro-batch size or raise tensor/pipeline parallelism (",
                       cudaGetErrorString(error), ")"));
    }
    stats_.reserved_bytes += size;
    ++stats_.cuda_mallocs;
  }
  stats_.allocated_bytes += size;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return ptr;
}

void CachingAllocator::Deallocate(void* ptr, size_t bytes) {
  const size_t size = RoundedSize(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  free_blocks_.emplace(size, ptr);
  stats_.allocated_bytes -= size;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

void CachingAllocator::ReleaseCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  ReleaseCacheLocked();
}

void CachingAllocator::ReleaseCacheLocked() {
  if (free_blocks_.empty()) return;
  // cudaFree waits for the device, so no kernel can still be using a cached block.
  cudaSetDevice(device_);
  for (const auto& [size, ptr] : free_blocks_) {
    cudaFree(ptr);
    stats_.reserved_bytes -= size;
  }
  free_blocks_.clear();
}

}  // namespace nf::cuda
