#include "core/cuda/cuda_context.h"

#include <array>
#include <atomic>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_check.h"

namespace nf::cuda {
namespace {

absl::Status FaultStatus(const DeviceFault& fault) {
  switch (fault.code) {
    case kNoFault:
      return absl::OkStatus();
    case kEmbeddingIdOutOfRange:
      return absl::InvalidArgumentError(
          absl::StrCat("EmbeddingForward: token id ", fault.value, " at position ", fault.position,
                       " is outside the vocabulary [0, ", fault.limit, ")"));
    case kCrossEntropyTargetOutOfRange:
      return absl::InvalidArgumentError(absl::StrCat(
          "CrossEntropySumExp: target ", fault.value, " of row ", fault.position,
          " is outside the vocabulary [0, ", fault.limit, ") and is not -1 (ignored)"));
  }
  return absl::InternalError(absl::StrCat("unknown device fault code ", fault.code));
}

}  // namespace

absl::StatusOr<int> DeviceCountFromResult(cudaError_t result, int count) {
  if (result == cudaSuccess) return count;
  if (result == cudaErrorNoDevice) return 0;
  return absl::FailedPreconditionError(absl::StrCat(
      "cudaGetDeviceCount failed: ", cudaGetErrorName(result), ": ", cudaGetErrorString(result)));
}

absl::StatusOr<int> CheckedDeviceCount() {
  int count = 0;
  const cudaError_t result = cudaGetDeviceCount(&count);
  if (result != cudaSuccess) cudaGetLastError();  // not sticky: clear it for the next call
  return DeviceCountFromResult(result, count);
}

int DeviceCount() { return CheckedDeviceCount().value_or(0); }

absl::StatusOr<std::string> DeviceUuid(int device) {
  cudaDeviceProp properties;
  NF_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, device));
  std::string uuid = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) uuid += '-';
    absl::StrAppend(&uuid,
                    absl::Hex(static_cast<uint8_t>(properties.uuid.bytes[i]), absl::kZeroPad2));
  }
  return uuid;
}

absl::StatusOr<int64_t> FreeMemory(int device) {
  NF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  size_t free_bytes = 0, total_bytes = 0;
  NF_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

absl::StatusOr<CudaContext*> CudaContext::ForDevice(int device) {
  static std::mutex mutex;
  static std::array<std::atomic<CudaContext*>, kMaxDevices> contexts{};
  // Every op asks for its device's context: after the first, without a lock or a driver call.
  if (device >= 0 && device < kMaxDevices) {
    if (CudaContext* ready = contexts[device].load(std::memory_order_acquire)) return ready;
  }
  const absl::StatusOr<int> counted = CheckedDeviceCount();
  const int count = counted.value_or(0);
  if (device < 0 || device >= count || device >= kMaxDevices) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", device, " does not exist: this process sees ", count, " GPU(s) (",
                     counted.ok() ? "check CUDA_VISIBLE_DEVICES and the driver with nvidia-smi"
                                  : counted.status().message(),
                     ")"));
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (contexts[device].load(std::memory_order_relaxed) == nullptr) {
    // Lives for the process: kernels may still be queued when static destructors run.
    auto* context = new CudaContext(device);
    absl::Status status = context->Init();
    if (!status.ok()) {
      delete context;
      return status;
    }
    contexts[device].store(context, std::memory_order_release);
  }
  return contexts[device].load(std::memory_order_relaxed);
}

absl::Status CudaContext::Init() {
  NF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  NF_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties_, device_));
  NF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  NF_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&cublaslt_));
  NF_CUDA_RETURN_IF_ERROR(cudaMalloc(&gemm_workspace_, kGemmWorkspaceBytes));
  NF_CUDA_RETURN_IF_ERROR(cudaMalloc(&fault_, sizeof(DeviceFault)));
  NF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(fault_, 0, sizeof(DeviceFault), stream_));
  return absl::OkStatus();
}

CudaContext::~CudaContext() {
  cudaSetDevice(device_);
  if (fault_ != nullptr) cudaFree(fault_);
  if (gemm_workspace_ != nullptr) cudaFree(gemm_workspace_);
  if (cublaslt_ != nullptr) cublasLtDestroy(cublaslt_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaContext::Synchronize() {
  DeviceFault fault{};
  NF_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&fault, fault_, sizeof(fault), cudaMemcpyDeviceToHost, stream_));
  NF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (fault.code != kNoFault) {
    NF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(fault_, 0, sizeof(DeviceFault), stream_));
  }
  return FaultStatus(fault);
}

}  // namespace nf::cuda
