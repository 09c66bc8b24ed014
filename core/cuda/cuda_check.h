// Turning CUDA runtime and cuBLASLt error codes into absl statuses that name the failed call.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace nf::cuda {

inline absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  const absl::StatusCode code = error == cudaErrorMemoryAllocation
                                    ? absl::StatusCode::kResourceExhausted
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(call, " failed: ", cudaGetErrorName(error), " (",
                                         cudaGetErrorString(error), ")"));
}

inline absl::Status CublasStatus(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(call, " failed: cuBLAS status ", static_cast<int>(status)));
}

}  // namespace nf::cuda

// Returns a status naming the expression when a CUDA runtime call fails.
#define NF_CUDA_RETURN_IF_ERROR(call)                                       \
  do {                                                                      \
    ::absl::Status nf_cuda_status_ = ::nf::cuda::CudaStatus((call), #call); \
    if (!nf_cuda_status_.ok()) return nf_cuda_status_;                      \
  } while (false)

#define NF_CUBLAS_RETURN_IF_ERROR(call)                                         \
  do {                                                                          \
    ::absl::Status nf_cublas_status_ = ::nf::cuda::CublasStatus((call), #call); \
    if (!nf_cublas_status_.ok()) return nf_cublas_status_;                      \
  } while (false)

// After a kernel launch: a bad launch configuration is reported at once (the kernel's own
// faults surface at the next synchronisation).
#define NF_CUDA_RETURN_IF_LAUNCH_FAILED() NF_CUDA_RETURN_IF_ERROR(cudaGetLastError())
