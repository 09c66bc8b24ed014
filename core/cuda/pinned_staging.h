// Host-to-device copies through pinned buffers, so the host never waits for the GPU to reach
// a copy.
//
// A cudaMemcpyAsync from pageable memory is staged by the driver through its own small pinned
// buffer; a copy that does not fit returns only once the stream has reached it, and then the
// host issues nothing while the GPU drains its queue. Token ids and targets are such copies,
// two per micro-batch ([micro_batch, seq] int32 each: 128 KiB at micro-batch 16, seq 2048).
// PinnedStaging copies the source into one of its pinned buffers on the host (memcpy) and
// issues the device copy from there, returning at once. A buffer is reused only once an event
// recorded after its copy has completed: queried, never waited for, while fewer than
// kMaxBuffers are in flight; the host waits (for the oldest) only beyond that.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"

namespace nf::cuda {

class PinnedStaging {
 public:
  // Larger copies (weights at load, a checkpoint's pieces) go straight from pageable memory:
  // they are rare, and a pinned copy of each would pin gigabytes of host memory.
  static constexpr size_t kMaxStagedBytes = size_t{16} << 20;
  // More copies in flight than a training step has micro-batches x 2 (ids, targets).
  static constexpr int kMaxBuffers = 64;

  explicit PinnedStaging(int device) : device_(device) {}
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // Copies `bytes` from host memory `src` to device memory `dst` on `stream`; `src` may be
  // reused as soon as this returns.
  absl::Status CopyToDevice(const void* src, void* dst, size_t bytes, cudaStream_t stream);

  // The pinned buffers made so far (at most kMaxBuffers); for tests.
  int buffers() const;

 private:
  struct Buffer {
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t copied = nullptr;  // recorded after the buffer's last copy
    uint64_t last_use = 0;         // order of issue, to find the oldest when all are busy
  };

  // A buffer of at least `bytes` whose last copy has run, made if none is and fewer than
  // kMaxBuffers exist; otherwise the oldest, once its copy has run.
  absl::Status TakeBuffer(size_t bytes, Buffer*& taken);
  absl::Status Grow(Buffer& buffer, size_t bytes);

  const int device_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  // Outgrown buffers not yet freed because communication was in flight (Grow).
  std::vector<void*> retired_;
  uint64_t uses_ = 0;
};

}  // namespace nf::cuda
