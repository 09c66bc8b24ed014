// Maps a device to the backend that runs ops on it and the allocator its tensors come from.
#include <atomic>

#include "absl/strings/str_cat.h"
#include "core/cpu/cpu_backend.h"
#include "core/ops/backend.h"
#include "core/status.h"
#if NF_WITH_CUDA
#include "core/cuda/cuda_backend.h"
#endif

namespace nf::ops {
namespace {

absl::Status NoCudaInThisBuild(Device device) {
  return absl::UnimplementedError(absl::StrCat(
      "no backend for ", device.ToString(),
      " in this build; the CUDA backend is built with -DNF_CUDA=ON on a machine with nvcc"));
}

}  // namespace

absl::StatusOr<Backend*> BackendFor(Device device) {
  if (device.type == DeviceType::kCpu) {
    static cpu::CpuBackend* cpu_backend = new cpu::CpuBackend();
    return cpu_backend;
  }
#if NF_WITH_CUDA
  NF_ASSIGN_OR_RETURN(cuda::CudaBackend * backend, cuda::BackendForDevice(device.index));
  return backend;
#else
  return NoCudaInThisBuild(device);
#endif
}

int GpuCount() {
#if NF_WITH_CUDA
  return cuda::DeviceCount();
#else
  return 0;
#endif
}

std::string GpuCountError() {
#if NF_WITH_CUDA
  const absl::StatusOr<int> count = cuda::CheckedDeviceCount();
  return count.ok() ? std::string() : std::string(count.status().message());
#else
  return std::string();
#endif
}

absl::StatusOr<int64_t> FreeGpuMemory(int gpu) {
#if NF_WITH_CUDA
  return cuda::FreeMemory(gpu);
#else
  return NoCudaInThisBuild(Device::Cuda(gpu));
#endif
}

absl::StatusOr<std::string> GpuUuid(int gpu) {
#if NF_WITH_CUDA
  return cuda::DeviceUuid(gpu);
#else
  return NoCudaInThisBuild(Device::Cuda(gpu));
#endif
}

absl::StatusOr<Allocator*> AllocatorFor(Device device) {
  if (device.type == DeviceType::kCpu) return &CpuAllocator();
#if NF_WITH_CUDA
  NF_ASSIGN_OR_RETURN(cuda::CudaContext * context, cuda::CudaContext::ForDevice(device.index));
  return &context->allocator();
#else
  return NoCudaInThisBuild(device);
#endif
}

int64_t BytesInUse(Device device) {
#if NF_WITH_CUDA
  if (device.type == DeviceType::kCuda) {
    auto context = cuda::CudaContext::ForDevice(device.index);
    return context.ok() ? static_cast<int64_t>((*context)->allocator().stats().allocated_bytes) : 0;
  }
#endif
  (void)device;
  return 0;
}

namespace {
std::atomic<int64_t> host_syncs{0};
}  // namespace

int64_t HostSyncs() { return host_syncs.load(std::memory_order_relaxed); }
void internal::CountHostSync() { host_syncs.fetch_add(1, std::memory_order_relaxed); }

absl::Status Synchronize(Device device) {
  internal::CountHostSync();
  if (device.type == DeviceType::kCpu) return absl::OkStatus();
#if NF_WITH_CUDA
  NF_ASSIGN_OR_RETURN(cuda::CudaContext * context, cuda::CudaContext::ForDevice(device.index));
  return context->Synchronize();
#else
  return NoCudaInThisBuild(device);
#endif
}

}  // namespace nf::ops
