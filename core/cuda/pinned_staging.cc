#include "core/cuda/pinned_staging.h"

#include <cstring>
#include <utility>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/outstanding_communication.h"
#include "core/status.h"

namespace nf::cuda {
namespace {

// Buffers grow in 64 KiB steps so that ids and targets of similar sizes share them.
constexpr size_t kGranule = size_t{64} << 10;

}  // namespace

PinnedStaging::~PinnedStaging() {
  cudaSetDevice(device_);
  for (const std::unique_ptr<Buffer>& b : buffers_) {
    if (b->copied != nullptr) {
      cudaEventSynchronize(b->copied);
      cudaEventDestroy(b->copied);
    }
    if (b->host != nullptr) cudaFreeHost(b->host);
  }
  for (void* host : retired_) cudaFreeHost(host);
}

int PinnedStaging::buffers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(buffers_.size());
}

absl::Status PinnedStaging::Grow(Buffer& buffer, size_t bytes) {
  if (buffer.capacity >= bytes) return absl::OkStatus();
  // cudaFreeHost waits for the whole device, NCCL's kernels included, which may wait for peers
  // (outstanding_communication.h): while communication is in flight the small buffer is kept aside
  // and freed at a later growth with none in flight, or at the end.
  if (OutstandingCommunication(device_) > 0) {
    if (buffer.host != nullptr) retired_.push_back(buffer.host);
  } else {
    const std::vector<void*> retired = std::move(retired_);
    retired_.clear();
    for (void* host : retired) NF_CUDA_RETURN_IF_ERROR(cudaFreeHost(host));
    if (buffer.host != nullptr) NF_CUDA_RETURN_IF_ERROR(cudaFreeHost(buffer.host));
  }
  buffer.host = nullptr;
  buffer.capacity = 0;
  const size_t capacity = (bytes + kGranule - 1) / kGranule * kGranule;
  NF_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&buffer.host, capacity, cudaHostAllocDefault));
  buffer.capacity = capacity;
  return absl::OkStatus();
}

absl::Status PinnedStaging::TakeBuffer(size_t bytes, Buffer*& taken) {
  Buffer* oldest = nullptr;
  Buffer* idle_small = nullptr;
  for (const std::unique_ptr<Buffer>& b : buffers_) {
    const cudaError_t state = cudaEventQuery(b->copied);
    if (state == cudaSuccess) {
      if (b->capacity >= bytes) {
        taken = b.get();
        return absl::OkStatus();
      }
      idle_small = b.get();
    } else if (state != cudaErrorNotReady) {
      NF_CUDA_RETURN_IF_ERROR(state);
    }
    if (oldest == nullptr || b->last_use < oldest->last_use) oldest = b.get();
  }
  if (static_cast<int>(buffers_.size()) < kMaxBuffers) {
    auto made = std::make_unique<Buffer>();
    NF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&made->copied, cudaEventDisableTiming));
    buffers_.push_back(std::move(made));
    taken = buffers_.back().get();
  } else if (idle_small != nullptr) {
    taken = idle_small;
  } else {
    // Every buffer is in flight: the host is kMaxBuffers copies ahead of the GPU.
    NF_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(oldest->copied));
    taken = oldest;
  }
  return Grow(*taken, bytes);
}

absl::Status PinnedStaging::CopyToDevice(const void* src, void* dst, size_t bytes,
                                         cudaStream_t stream) {
  if (bytes > kMaxStagedBytes) {
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream),
                      "cudaMemcpyAsync (pageable)");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Buffer* buffer = nullptr;
  NF_RETURN_IF_ERROR(TakeBuffer(bytes, buffer));
  std::memcpy(buffer->host, src, bytes);
  NF_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, buffer->host, bytes, cudaMemcpyHostToDevice, stream));
  NF_CUDA_RETURN_IF_ERROR(cudaEventRecord(buffer->copied, stream));
  buffer->last_use = ++uses_;
  return absl::OkStatus();
}

}  // namespace nf::cuda
