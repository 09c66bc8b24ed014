// What a device backend implements: one method per op of ops.h, called only after ops.cc has
// validated the arguments, so implementations may assume consistent shapes, dtypes and devices.
#pragma once

#include "absl/status/status.h"
#include "core/device.h"
#include "core/ops/op_timing.h"
#include "core/ops/ops.h"

namespace nf::ops {

class Backend {
 public:
  virtual ~Backend() = default;

  virtual absl::Status Gemm(const GemmArgs& args) = 0;

  virtual absl::Status AddBias(const Tensor& x, const Tensor& bias) = 0;
  virtual absl::Status BiasBackward(const Tensor& dy, const Tensor& dbias) = 0;
  virtual absl::Status ActivationForward(Activation act, const Tensor& x, const Tensor& y) = 0;
  virtual absl::Status ActivationBackward(Activation act, const Tensor& x, const Tensor& dy,
                                          const Tensor& dx) = 0;
  virtual absl::Status Dropout(const Tensor& x, const Tensor& y, const DropoutSpec& spec) = 0;

  virtual absl::Status ScaleChannels(const Tensor& x, const Tensor& scale, int64_t inner,
                                     const Tensor& y) = 0;
  virtual absl::Status ScaleChannelsBackward(const Tensor& x, const Tensor& scale, int64_t inner,
                                             const Tensor& dy, const Tensor& dx,
                                             const Tensor& dscale) = 0;
  virtual absl::Status SplitHeads(const Tensor& tokens, const Tensor& heads) = 0;
  virtual absl::Status MergeHeads(const Tensor& heads, const Tensor& tokens) = 0;
  virtual absl::Status MergeScaledHeads(const Tensor& heads, const Tensor& scale,
                                        const Tensor& tokens) = 0;
  virtual absl::Status MergeScaledHeadsBackward(const Tensor& d_tokens, const Tensor& heads,
                                                const Tensor& scale, const Tensor& d_heads,
                                                const Tensor& dscale) = 0;

  virtual absl::Status LayerNormForward(const LayerNormArgs& args) = 0;
  virtual absl::Status LayerNormPartialStats(const Tensor& x, const Tensor& stats) = 0;
  virtual absl::Status LayerNormForwardFromStats(const LayerNormArgs& args, const Tensor& stats,
                                                 int64_t total_cols) = 0;
  virtual absl::Status LayerNormBackward(const LayerNormBackwardArgs& args) = 0;
  virtual absl::Status LayerNormBackwardPartialSums(const LayerNormBackwardArgs& args,
                                                    const Tensor& sums) = 0;
  virtual absl::Status LayerNormBackwardFromSums(const LayerNormBackwardArgs& args,
                                                 const Tensor& sums, int64_t total_cols) = 0;

  virtual absl::Status ActivationNormForward(const ActivationNormArgs& args) = 0;
  virtual absl::Status ActivationNormBackward(const ActivationNormBackwardArgs& args) = 0;
  virtual absl::Status ResidualNormForward(const ResidualNormArgs& args) = 0;
  virtual absl::Status ResidualNormBackward(const ResidualNormBackwardArgs& args) = 0;

  virtual absl::Status SoftmaxForward(const Tensor& x, const Tensor& y) = 0;
  virtual absl::Status SoftmaxBackward(const Tensor& y, const Tensor& dy, const Tensor& dx) = 0;
  virtual absl::Status AttentionForward(const AttentionArgs& args) = 0;
  virtual absl::Status AttentionBackward(const AttentionBackwardArgs& args) = 0;
  virtual absl::Status KvCacheAttention(const KvCacheAttentionArgs& args) = 0;

  virtual absl::Status EmbeddingForward(const EmbeddingArgs& args) = 0;
  virtual absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout,
                                         const Tensor& dtable, int64_t vocab_offset) = 0;
  virtual absl::Status CrossEntropyRowMax(const CrossEntropyArgs& args, const Tensor& row_max) = 0;
  virtual absl::Status CrossEntropySumExp(const CrossEntropyArgs& args, const Tensor& row_max,
                                          const Tensor& sum_exp, const Tensor& target_logit) = 0;
  virtual absl::Status CrossEntropyLoss(const Tensor& targets, const Tensor& row_max,
                                        const Tensor& sum_exp, const Tensor& target_logit,
                                        const Tensor& loss) = 0;
  virtual absl::Status AccumulateLoss(const Tensor& loss, const Tensor& targets,
                                      const Tensor& totals) = 0;
  virtual absl::Status CrossEntropyBackward(const CrossEntropyArgs& args, const Tensor& row_max,
                                            const Tensor& sum_exp, const Tensor& dloss,
                                            const Tensor& dlogits) = 0;

  virtual absl::Status AdamWStep(const AdamWArgs& args) = 0;
  virtual absl::Status AdamWWouldOverflow(const AdamWArgs& args, float grad_scale,
                                          DType model_dtype, const Tensor& found) = 0;
  virtual absl::Status UnscaleAndCheck(const Tensor& grads, float inv_scale,
                                       const Tensor& found_nonfinite) = 0;
  virtual absl::Status SquaredNorm(const Tensor& x, const Tensor& out) = 0;

  virtual absl::Status Cast(const Tensor& src, const Tensor& dst) = 0;
  virtual absl::Status Fill(const Tensor& x, float value) = 0;
  virtual absl::Status Scale(const Tensor& x, float alpha) = 0;
  virtual absl::Status Axpy(float alpha, const Tensor& x, const Tensor& y) = 0;
  // Same dtype and size; one side may be on the host when this is a device's backend.
  virtual absl::Status Copy(const Tensor& src, const Tensor& dst) = 0;

  // A span on this backend's timeline for per-op timing (op_timing.h), started now; null when
  // none can be made. The wall clock suits a backend whose ops finish before they return.
  virtual std::unique_ptr<TimedSpan> StartTimedSpan() { return StartWallClockSpan(); }
};

// The backend for tensors on `device`, or an error naming the device when none is built in.
absl::StatusOr<Backend*> BackendFor(Device device);

// The CUDA backend's cuBLASLt workspace, allocated once per GPU (core/cuda/cuda_context.h):
// cuBLASLt's recommended size for Hopper, which also covers Ampere's. The memory estimate
// (launcher/memory_estimate.h) counts it.
inline constexpr int64_t kGpuGemmWorkspaceBytes = int64_t{32} << 20;

// GPUs this process can use: 0 in a build without the CUDA backend or on a machine without one.
int GpuCount();

// Why GpuCount() is 0 when CUDA itself failed to count (its error name and string, e.g.
// "cudaGetDeviceCount failed: cudaErrorInsufficientDriver: CUDA driver version is insufficient
// for CUDA runtime version"), for the messages of callers that refuse to start; "" when the
// count was read (a machine without a GPU, cudaErrorNoDevice, included) or in a build without
// the CUDA backend.
std::string GpuCountError();

// The bytes GPU `gpu` can still allocate (cudaMemGetInfo's free figure); Unimplemented in a
// build without the CUDA backend. Host memory: core/host_memory.h.
absl::StatusOr<int64_t> FreeGpuMemory(int gpu);

// GPU `gpu`'s UUID, the same in every process that sees it ("GPU-..." as nvidia-smi -L prints
// it); Unimplemented in a build without the CUDA backend.
absl::StatusOr<std::string> GpuUuid(int gpu);

// The allocator for tensors on `device` (the CUDA backend's caching allocator for GPUs).
absl::StatusOr<Allocator*> AllocatorFor(Device device);

// Bytes of `device` memory held by tensors (the caching allocator's count on a GPU; 0 on the
// CPU, whose memory shows in the process's resident set).
int64_t BytesInUse(Device device);

// Waits until every op enqueued for `device` has finished, and reports a bad input that a
// device kernel recorded on the way (CPU ops run synchronously: always OK there).
absl::Status Synchronize(Device device);

// The host synchronisations this process has asked for: every Synchronize and every OnHost (a
// read of a computed value), counted on the CPU too, where they cost nothing, so that a CPU
// test sees where a GPU step would make the host wait for the device
// (tests/launcher/trainer_test.cc holds a training step to its budget). Waits for
// communication are not counted here (CommStats). Any thread.
int64_t HostSyncs();
namespace internal {
void CountHostSync();
}  // namespace internal

}  // namespace nf::ops
