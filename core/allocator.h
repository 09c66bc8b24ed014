// Allocators hand out raw device memory for tensor storage. The CPU allocator aligns every
// block to 64 bytes (a cache line, and a full AVX-512 vector). The CUDA backend adds a caching
// device allocator behind the same interface.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "core/device.h"

namespace nf {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // Returns a block of at least `bytes` bytes (a non-null pointer even for 0 bytes).
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  // Returns a block obtained from Allocate() with the same `bytes`.
  virtual void Deallocate(void* ptr, size_t bytes) = 0;
};

inline constexpr size_t kCpuAlignment = 64;

// The process-wide CPU allocator (64-byte aligned).
Allocator& CpuAllocator();

}  // namespace nf
