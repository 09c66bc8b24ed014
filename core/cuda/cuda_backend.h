// The CUDA backend: cuBLASLt for matrix products, CUDA kernels for the rest, all enqueued on
// the device's compute stream (cuda_context.h) without host synchronisation. Each method
// computes what its CPU twin (core/cpu) computes, with fp32 arithmetic and accumulation; sums
// run in a fixed order per launch configuration (no atomics except EmbeddingBackward's), so
// results repeat run to run. Methods are defined by concern in gemm.cc, elementwise.cu,
// layout.cu, layer_norm.cu, attention.cu, attention_dispatch.cc (cuDNN's fused attention or the
// own kernel), embedding_loss.cu, optimizer.cu and copy.cc.
#pragma once

#include "core/cuda/cuda_context.h"
#include "core/ops/backend.h"

namespace nf::cuda {

class CudaBackend final : public ops::Backend {
 public:
  explicit CudaBackend(CudaContext& context) : context_(context) {}

  CudaContext& context() const { return context_; }

  absl::Status Gemm(const ops::GemmArgs& args) override;

  absl::Status AddBias(const Tensor& x, const Tensor& bias) override;
  absl::Status BiasBackward(const Tensor& dy, const Tensor& dbias) override;
  absl::Status ActivationForward(ops::Activation act, const Tensor& x, const Tensor& y) override;
  absl::Status ActivationBackward(ops::Activation act, const Tensor& x, const Tensor& dy,
                                  const Tensor& dx) override;
  absl::Status Dropout(const Tensor& x, const Tensor& y, const ops::DropoutSpec& spec) override;

  absl::Status ScaleChannels(const Tensor& x, const Tensor& scale, int64_t inner,
                             const Tensor& y) override;
  absl::Status ScaleChannelsBackward(const Tensor& x, const Tensor& scale, int64_t inner,
                                     const Tensor& dy, const Tensor& dx,
                                     const Tensor& dscale) override;
  absl::Status SplitHeads(const Tensor& tokens, const Tensor& heads) override;
  absl::Status MergeHeads(const Tensor& heads, const Tensor& tokens) override;
  absl::Status MergeScaledHeads(const Tensor& heads, const Tensor& scale,
                                const Tensor& tokens) override;
  absl::Status MergeScaledHeadsBackward(const Tensor& d_tokens, const Tensor& heads,
                                        const Tensor& scale, const Tensor& d_heads,
                                        const Tensor& dscale) override;

  absl::Status LayerNormForward(const ops::LayerNormArgs& args) override;
  absl::Status LayerNormPartialStats(const Tensor& x, const Tensor& stats) override;
  absl::Status LayerNormForwardFromStats(const ops::LayerNormArgs& args, const Tensor& stats,
                                         int64_t total_cols) override;
  absl::Status LayerNormBackward(const ops::LayerNormBackwardArgs& args) override;
  absl::Status LayerNormBackwardPartialSums(const ops::LayerNormBackwardArgs& args,
                                            const Tensor& sums) override;
  absl::Status LayerNormBackwardFromSums(const ops::LayerNormBackwardArgs& args, const Tensor& sums,
                                         int64_t total_cols) override;

  absl::Status ActivationNormForward(const ops::ActivationNormArgs& args) override;
  absl::Status ActivationNormBackward(const ops::ActivationNormBackwardArgs& args) override;
  absl::Status ResidualNormForward(const ops::ResidualNormArgs& args) override;
  absl::Status ResidualNormBackward(const ops::ResidualNormBackwardArgs& args) override;

  absl::Status SoftmaxForward(const Tensor& x, const Tensor& y) override;
  absl::Status SoftmaxBackward(const Tensor& y, const Tensor& dy, const Tensor& dx) override;
  absl::Status AttentionForward(const ops::AttentionArgs& args) override;
  absl::Status AttentionBackward(const ops::AttentionBackwardArgs& args) override;
  absl::Status KvCacheAttention(const ops::KvCacheAttentionArgs& args) override;

  absl::Status EmbeddingForward(const ops::EmbeddingArgs& args) override;
  absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                                 int64_t vocab_offset) override;
  absl::Status CrossEntropyRowMax(const ops::CrossEntropyArgs& args,
                                  const Tensor& row_max) override;
  absl::Status CrossEntropySumExp(const ops::CrossEntropyArgs& args, const Tensor& row_max,
                                  const Tensor& sum_exp, const Tensor& target_logit) override;
  absl::Status CrossEntropyLoss(const Tensor& targets, const Tensor& row_max, const Tensor& sum_exp,
                                const Tensor& target_logit, const Tensor& loss) override;
  absl::Status AccumulateLoss(const Tensor& loss, const Tensor& targets,
                              const Tensor& totals) override;
  absl::Status CrossEntropyBackward(const ops::CrossEntropyArgs& args, const Tensor& row_max,
                                    const Tensor& sum_exp, const Tensor& dloss,
                                    const Tensor& dlogits) override;

  absl::Status AdamWStep(const ops::AdamWArgs& args) override;
  absl::Status AdamWWouldOverflow(const ops::AdamWArgs& args, float grad_scale, DType model_dtype,
                                  const Tensor& found) override;
  absl::Status UnscaleAndCheck(const Tensor& grads, float inv_scale,
                               const Tensor& found_nonfinite) override;
  absl::Status SquaredNorm(const Tensor& x, const Tensor& out) override;

  absl::Status Cast(const Tensor& src, const Tensor& dst) override;
  absl::Status Fill(const Tensor& x, float value) override;
  absl::Status Scale(const Tensor& x, float alpha) override;
  absl::Status Axpy(float alpha, const Tensor& x, const Tensor& y) override;
  absl::Status Copy(const Tensor& src, const Tensor& dst) override;

  std::unique_ptr<ops::TimedSpan> StartTimedSpan() override;  // CUDA events (timed_span.cc)

 private:
  cudaStream_t stream() const { return context_.stream(); }

  // The project's own attention kernels, causal or bidirectional (attention.cu), for the calls
  // cuDNN does not take (attention_dispatch.h); q non-empty.
  absl::Status OwnAttentionForward(const ops::AttentionArgs& args);
  absl::Status OwnAttentionBackward(const ops::AttentionBackwardArgs& args);

  CudaContext& context_;
};

// The backend of GPU `device` (its context created on first use).
absl::StatusOr<CudaBackend*> BackendForDevice(int device);

}  // namespace nf::cuda
