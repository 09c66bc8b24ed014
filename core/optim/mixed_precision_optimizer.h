// AdamW with fp32 master weights over flat parameter buffers (mixed-precision training as in
// Megatron-LM and fairseq's FP16Optimizer).
//
// The model computes with `model_params` (flat [n], f32, f16 or bf16) and its backward
// accumulates fp32 main gradients into `grads` (flat f32 [n]). The optimizer owns fp32 master
// weights [n] (for f32 models the master IS model_params: no copy) and the AdamW moments
// exp_avg, exp_avg_sq [n]. `ranges` say which parts of the buffer it updates and which take
// weight decay; elements outside every range (alignment padding) are never read or written.
//
// One step, split so that distributed code can interpose reductions between the stages:
//   found = UnscaleAndCheck(loss_scale)           // grads /= loss_scale; [all-reduce found]
//   if (!found) {
//     sq = SquaredGradNorm()                      // [all-reduce sq]
//     overflow = UpdateWouldOverflow(lr, sqrt(sq))  // writes nothing; [all-reduce overflow]
//     if (!overflow) Update(lr, sqrt(sq))         // clip, AdamW, master -> model params
//   }
// Step() runs the four on one rank. An AdamW update cannot be undone exactly, so whether it
// would leave a weight the model dtype cannot hold (fp16 overflows to inf at |w| >= 65520) is
// checked before it is applied; such a step is skipped like one with non-finite gradients.
// Everything is allocated by Create; the stages allocate nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/allocator.h"
#include "core/ops/ops.h"
#include "core/tensor.h"

namespace nf::optim {

// Elements [offset, offset + length) of a flat buffer.
struct FlatRange {
  int64_t offset;
  int64_t length;

  bool operator==(const FlatRange&) const = default;
};

// Elements [offset, offset + length) of the flat buffers: one parameter, or several.
struct ParamRange {
  int64_t offset;
  int64_t length;
  bool weight_decay;  // false for LayerNorm parameters, biases, head and residual scales

  bool operator==(const ParamRange&) const = default;
};

struct AdamWConfig {
  float beta1;         // in [0, 1)
  float beta2;         // in [0, 1)
  float eps;           // > 0, added to sqrt(v_hat)
  float weight_decay;  // >= 0, decoupled, on ranges with weight_decay only
  float clip_grad;     // >= 0; global gradient-norm threshold, 0 turns clipping off
};

// OK, or InvalidArgument with a one-line message naming the offending setting.
absl::Status Validate(const AdamWConfig& config);

// Why a step was skipped (nothing updated, the loss scaler told `skipped`).
enum class SkipReason {
  kNone,                // not skipped
  kNonFiniteGradients,  // a gradient, or the fp32 sum of their squares, is inf or NaN
  kUpdateOverflow,      // the update would take a weight (or a moment) past the model dtype
  // Decided by the training loop, not the optimizer:
  kSpike,        // a loss or gradient-norm spike (train.spike.action SKIP or ROLLBACK)
  kSkippedData,  // the step's batch overlaps a skipped window of the stream (train.skip_samples)
};
// "none", "nonfinite_grads", "update_overflow", "spike", "skipped_data": the spelling of logs.
absl::string_view SkipReasonName(SkipReason reason);

struct StepResult {
  bool skipped;  // nothing was updated (see reason)
  SkipReason reason = SkipReason::kNone;
  // L2 norm of the unscaled, unclipped gradients; NaN when a gradient was not finite, inf
  // when only the norm overflowed.
  double grad_norm;
};

class MixedPrecisionAdamW {
 public:
  // Validates everything and allocates master weights (unless model_params is f32) and zeroed
  // moments with `allocator`, which must allocate on model_params' device. Ranges may come in
  // any order, must lie inside the buffers and must not overlap; zero-length ranges are
  // ignored. The master weights are uninitialised until InitializeMasterFromModel().
  static absl::StatusOr<MixedPrecisionAdamW> Create(Tensor model_params, Tensor grads,
                                                    std::vector<ParamRange> ranges,
                                                    const AdamWConfig& config,
                                                    Allocator& allocator = CpuAllocator());

  MixedPrecisionAdamW(MixedPrecisionAdamW&&) = default;
  MixedPrecisionAdamW& operator=(MixedPrecisionAdamW&&) = default;
  // Copies would share every buffer with the original: not a copy in any useful sense.
  MixedPrecisionAdamW(const MixedPrecisionAdamW&) = delete;
  MixedPrecisionAdamW& operator=(const MixedPrecisionAdamW&) = delete;

  // master = model_params (cast to fp32), over the whole buffer. Call once after the model is
  // initialised (a checkpoint restore writes master() directly instead).
  absl::Status InitializeMasterFromModel();

  // grads *= 1 / loss_scale over the ranges; true when any result is inf or NaN. loss_scale
  // must be finite and > 0 (pass 1 without loss scaling: the check is still worth its pass).
  absl::StatusOr<bool> UnscaleAndCheck(float loss_scale);
  // Sum of squares of the grads over the ranges (the caller takes the square root after any
  // all-reduce). Accumulated in fp32 across ranges, in double within one.
  absl::StatusOr<double> SquaredGradNorm();
  // With grad_norm the global norm of the unscaled grads (finite, >= 0): when clip_grad > 0
  // and grad_norm > clip_grad, grads *= clip_grad / (grad_norm + 1e-6); then one AdamW update
  // with learning rate lr (finite, >= 0) on the master weights, and master -> model params.
  // Arguments are checked before anything changes.
  absl::Status Update(float lr, double grad_norm);
  // Whether Update(lr, grad_norm) would write a new master weight that the model dtype cannot
  // hold (its cast is inf or NaN: fp16 |w| >= 65520, bf16 past its largest finite value, f32
  // inf or NaN) or a non-finite moment. Computes every updated value with exactly the float
  // operations of Update (clipping included) and writes nothing: grads, master, moments, model
  // params and updates() stay as they are. Same arguments, and checks, as Update. It runs for
  // every model dtype: one more pass over master, grads and moments without writes, 16 of
  // AdamW's 28 bytes per parameter (memory-bound on either backend; bench/ops_bench.cc
  // adamw_overflow_check_*). No cheaper bound can stand in for it: ruling overflow out needs
  // bounds on master and moments, which only this pass, or figures kept from the last update
  // (stale once a checkpoint restore or anyone else writes the buffers), could give.
  absl::StatusOr<bool> UpdateWouldOverflow(float lr, double grad_norm);
  // The four stages on one rank. A non-finite gradient, a norm that overflows fp32, or an
  // update that would overflow the model dtype skips the update entirely (master, model
  // params, moments and updates() untouched; the grads stay divided by loss_scale until the
  // next step zeroes them); feed `skipped` to DynamicLossScaler::Update. With loss_scale 1 the
  // squared norm's pass also serves as the non-finite check (the same results, one pass fewer).
  absl::StatusOr<StepResult> Step(float lr, float loss_scale);

  // Buffers for checkpoints (flat [n] each; master() is model_params() for f32 models).
  const Tensor& model_params() const { return model_params_; }
  const Tensor& grads() const { return grads_; }
  const Tensor& master() const { return master_; }
  const Tensor& exp_avg() const { return exp_avg_; }
  const Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  // AdamW updates taken so far (the bias-correction step of the last one).
  int64_t updates() const { return updates_; }
  // Restores the counter from a checkpoint; InvalidArgument when negative.
  absl::Status SetUpdates(int64_t updates);

  const AdamWConfig& config() const { return config_; }
  // The ranges after sorting and merging touching ranges of equal weight_decay: one AdamW
  // call each.
  const std::vector<ParamRange>& merged_ranges() const { return merged_ranges_; }

 private:
  // Views of one AdamW range (same decay flag).
  struct DecayGroup {
    Tensor master, grads, exp_avg, exp_avg_sq;
    bool weight_decay;
  };
  // Views of one maximal run of covered elements, whatever the decay flags: the unit of
  // unscaling, norms, clipping and the master -> model cast.
  struct Span {
    Tensor grads, master, model;
  };

  MixedPrecisionAdamW() = default;
  // UnscaleAndCheck then SquaredGradNorm, as Step needs them: the squared norm of the unscaled
  // grads, NaN when one of them is not finite. Without loss scaling (1) in one pass over the
  // grads instead of two.
  absl::StatusOr<double> UnscaledSquaredGradNorm(float loss_scale);
  // The argument checks of Update and UpdateWouldOverflow (`stage` names the caller).
  absl::Status CheckUpdateArgs(absl::string_view stage, float lr, double grad_norm) const;
  // The factor clipping multiplies the grads by (1 when it does not apply).
  float ClipCoefficient(double grad_norm) const;
  // The AdamW arguments of decay group g for bias-correction step `step`.
  ops::AdamWArgs AdamWArgsOf(const DecayGroup& g, float lr, int64_t step) const;

  Tensor model_params_, grads_, master_, exp_avg_, exp_avg_sq_;
  Tensor scalar_;  // f32 [1]: the non-finite flag, the squared norm, the overflow flag
  AdamWConfig config_{};
  std::vector<ParamRange> merged_ranges_;
  std::vector<DecayGroup> groups_;
  std::vector<Span> spans_;
  bool master_is_model_ = false;
  int64_t updates_ = 0;
};

}  // namespace nf::optim
