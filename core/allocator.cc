#include "core/allocator.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace nf {
namespace {

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
    return ptr;
  }

  void Deallocate(void* ptr, size_t /*bytes*/) override { std::free(ptr); }
};

}  // namespace

Allocator& CpuAllocator() {
  static AlignedCpuAllocator* allocator = new AlignedCpuAllocator();
  return *allocator;
}

}  // namespace nf
