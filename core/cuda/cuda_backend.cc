#include "core/cuda/cuda_backend.h"

#include <array>
#include <atomic>
#include <mutex>

#include "core/status.h"

namespace nf::cuda {

absl::StatusOr<CudaBackend*> BackendForDevice(int device) {
  static std::mutex mutex;
  static std::array<std::atomic<CudaBackend*>, kMaxDevices> backends{};
  // Every op asks for its device's backend: after the first, without a lock or a driver call.
  if (device >= 0 && device < kMaxDevices) {
    if (CudaBackend* ready = backends[device].load(std::memory_order_acquire)) return ready;
  }
  NF_ASSIGN_OR_RETURN(CudaContext * context, CudaContext::ForDevice(device));
  std::lock_guard<std::mutex> lock(mutex);
  if (backends[device].load(std::memory_order_relaxed) == nullptr) {
    backends[device].store(new CudaBackend(*context), std::memory_order_release);
  }
  return backends[device].load(std::memory_order_relaxed);
}

}  // namespace nf::cuda
