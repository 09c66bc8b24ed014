#include "core/allocator.h"

#include <atomic>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/allocator_usage.h"

namespace nf {
namespace {

std::atomic<int64_t> live_bytes{0};
std::atomic<int64_t> peak_bytes{0};

void RaisePeak(int64_t live) {
  int64_t peak = peak_bytes.load(std::memory_order_relaxed);
  while (live > peak && !peak_bytes.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

class AlignedCpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cpu(); }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    // aligned_alloc requires the size to be a multiple of the alignment.
    const size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
    if (ptr == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of host memory allocating ", bytes, " bytes"));
    }
    RaisePeak(live_bytes.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) +
              static_cast<int64_t>(bytes));
    return ptr;
  }

  void Deallocate(void* ptr, size_t bytes) override {
    live_bytes.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    std::free(ptr);
  }
};

}  // namespace

Allocator& CpuAllocator() {
  static AlignedCpuAllocator* allocator = new AlignedCpuAllocator();
  return *allocator;
}

AllocatorUsage CpuAllocatorUsage() {
  return {.live_bytes = live_bytes.load(std::memory_order_relaxed),
          .peak_bytes = peak_bytes.load(std::memory_order_relaxed)};
}

void ResetCpuAllocatorPeak() { peak_bytes.store(live_bytes.load(std::memory_order_relaxed)); }

}  // namespace nf
