// Copies between host and GPU memory on the compute stream, so a copy is ordered after the
// kernels that produced its source. A copy into host memory waits for its data (the caller
// reads it next); a copy from host memory goes through a pinned buffer (pinned_staging.h), so
// it returns at once, without waiting for the GPU to reach it, and the source may be reused.
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"

namespace nf::cuda {

absl::Status CudaBackend::Copy(const Tensor& src, const Tensor& dst) {
  if (src.nbytes() == 0) return absl::OkStatus();
  const bool from_host = src.device().type == DeviceType::kCpu;
  const bool to_host = dst.device().type == DeviceType::kCpu;
  if (from_host && !to_host) {
    return context().staging().CopyToDevice(src.raw_data(), dst.raw_data(), src.nbytes(), stream());
  }
  const cudaMemcpyKind kind = from_host ? cudaMemcpyHostToHost
                              : to_host ? cudaMemcpyDeviceToHost
                                        : cudaMemcpyDeviceToDevice;
  NF_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(), kind, stream()));
  if (to_host) NF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
  return absl::OkStatus();
}

}  // namespace nf::cuda
