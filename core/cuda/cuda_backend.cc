#include "core/cuda/cuda_backend.h"

#include <array>
#include <mutex>

#include "core/status.h"

namespace nf::cuda {

absl::StatusOr<CudaBackend*> BackendForDevice(int device) {
  NF_ASSIGN_OR_RETURN(CudaContext * context, CudaContext::ForDevice(device));
  static std::mutex mutex;
  static std::array<CudaBackend*, kMaxDevices> backends{};
  std::lock_guard<std::mutex> lock(mutex);
  if (backends[device] == nullptr) backends[device] = new CudaBackend(*context);
  return backends[device];
}

}  // namespace nf::cuda
