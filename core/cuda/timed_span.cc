// Per-op timing on the GPU (core/ops/op_timing.h): a span is two CUDA events recorded on the
// backend's stream around the op's launches; its length is read when the report is taken, so
// timing adds no synchronisation to the step.
#include <cmath>
#include <limits>
#include <memory>

#include "core/cuda/cuda_backend.h"

namespace nf::cuda {
namespace {

class CudaEventSpan final : public ops::TimedSpan {
 public:
  explicit CudaEventSpan(cudaStream_t stream) : stream_(stream) {}
  ~CudaEventSpan() override {
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (end_ != nullptr) cudaEventDestroy(end_);
  }
  bool Start() {
    return cudaEventCreate(&start_) == cudaSuccess && cudaEventCreate(&end_) == cudaSuccess &&
           cudaEventRecord(start_, stream_) == cudaSuccess;
  }
  void End() override { ended_ = cudaEventRecord(end_, stream_) == cudaSuccess; }
  // NaN when an event failed (the op's own error says why): a total that cannot be trusted
  // shows as nan rather than as a plausible figure.
  double Seconds() override {
    float ms = 0.0f;
    if (!ended_ || cudaEventSynchronize(end_) != cudaSuccess ||
        cudaEventElapsedTime(&ms, start_, end_) != cudaSuccess) {
      return std::numeric_limits<double>::quiet_NaN();
    }
    return 1e-3 * ms;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, end_ = nullptr;
  bool ended_ = false;
};

}  // namespace

std::unique_ptr<ops::TimedSpan> CudaBackend::StartTimedSpan() {
  auto span = std::make_unique<CudaEventSpan>(stream());
  if (!span->Start()) return nullptr;
  return span;
}

}  // namespace nf::cuda
