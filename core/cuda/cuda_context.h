// The per-GPU state of the CUDA backend: one compute stream on which every kernel, GEMM and
// copy of the device runs in issue order, the cuBLASLt handle and its workspace, the caching
// allocator, the pinned buffers host-to-device copies go through, and a small device-side
// error record.
//
// Kernels never stop the host to report bad data (a token id outside the vocabulary, a target
// outside it): they write the first such fault into the error record and carry on, and
// Synchronize() turns it into an InvalidArgument status. The training loop synchronises once
// per step (to read the loss), so a bad batch is reported at the end of the step it was in,
// and the per-micro-batch path has no host-device sync.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/pinned_staging.h"
#include "core/ops/backend.h"

namespace nf::cuda {

// What a kernel records about the first bad input it met (device memory, zero when none).
struct DeviceFault {
  int32_t code;      // DeviceFaultCode
  int32_t position;  // element index in the op's input
  int32_t value;     // the offending value
  int32_t limit;     // the bound it broke
};
enum DeviceFaultCode : int32_t {
  kNoFault = 0,
  kEmbeddingIdOutOfRange = 1,
  kCrossEntropyTargetOutOfRange = 2,
};

// The most GPUs one process drives (contexts are kept in a fixed table).
inline constexpr int kMaxDevices = 64;

// The number of GPUs this process can see (0 without a driver or a device; never an error).
int DeviceCount();

// cudaGetDeviceCount's answer as a status: the count, 0 for cudaErrorNoDevice (no GPU is the
// answer, not a failure), else CUDA's own error ("cudaGetDeviceCount failed:
// cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version"),
// which callers put in their message instead of guessing at CUDA_VISIBLE_DEVICES. Pure host
// logic: DeviceCountFromResult(result, count) is the decision, CheckedDeviceCount asks CUDA.
absl::StatusOr<int> DeviceCountFromResult(cudaError_t result, int count);
absl::StatusOr<int> CheckedDeviceCount();

// The bytes GPU `device` can still allocate (cudaMemGetInfo's free figure; the other processes
// on the GPU and this one's own cache already taken out).
absl::StatusOr<int64_t> FreeMemory(int device);

// GPU `device`'s UUID ("GPU-" and 32 hex digits, as nvidia-smi -L prints it): the same physical
// GPU has the same UUID in every process, whatever its index under CUDA_VISIBLE_DEVICES.
absl::StatusOr<std::string> DeviceUuid(int device);

class CudaContext {
 public:
  // The context of GPU `device`, created on first use (one per device for the process).
  static absl::StatusOr<CudaContext*> ForDevice(int device);

  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t cublaslt() const { return cublaslt_; }
  void* gemm_workspace() const { return gemm_workspace_; }
  size_t gemm_workspace_bytes() const { return kGemmWorkspaceBytes; }
  CachingAllocator& allocator() { return allocator_; }
  PinnedStaging& staging() { return staging_; }
  DeviceFault* fault_record() const { return fault_; }
  const cudaDeviceProp& properties() const { return properties_; }

  // Waits for all work on the stream, then reports (and clears) a recorded data fault.
  absl::Status Synchronize();

 private:
  // cuBLASLt's recommended workspace for Hopper (32 MiB) also covers Ampere's; the memory
  // estimate counts the same figure.
  static constexpr size_t kGemmWorkspaceBytes = ops::kGpuGemmWorkspaceBytes;

  explicit CudaContext(int device) : device_(device), allocator_(device), staging_(device) {}
  absl::Status Init();

  const int device_;
  CachingAllocator allocator_;
  PinnedStaging staging_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
  void* gemm_workspace_ = nullptr;
  DeviceFault* fault_ = nullptr;
  cudaDeviceProp properties_{};
};

}  // namespace nf::cuda
