// MixedPrecisionAdamW: range validation and merging at Create, then each stage is a handful of
// op-table calls over precomputed views (one per merged range), so a step neither allocates
// nor depends on the device beyond reading one fp32 scalar back.
#include "core/optim/mixed_precision_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/ops/checks.h"
#include "core/ops/ops.h"
#include "core/status.h"

namespace nf::optim {
namespace {

constexpr absl::string_view kName = "MixedPrecisionAdamW";

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(kName, ": ", message));
}

// "range 3 [10, 20)", for ranges already known to lie inside the buffers.
std::string RangeString(size_t index, const ParamRange& r) {
  return absl::StrCat("range ", index, " [", r.offset, ", ", r.offset + r.length, ")");
}

absl::Status CheckFlat(const Tensor& t, absl::string_view name) {
  if (t.rank() != 1) {
    return Invalid(absl::StrCat(name, " is ", t.DebugString(), ", expected a flat 1-D buffer"));
  }
  return absl::OkStatus();
}

// Every range inside [0, numel), non-overlapping; returns the non-empty ones' indices sorted by
// offset.
absl::StatusOr<std::vector<size_t>> SortedValidRanges(const std::vector<ParamRange>& ranges,
                                                      int64_t numel) {
  std::vector<size_t> order;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const ParamRange& r = ranges[i];
    if (r.offset < 0 || r.length < 0) {
      return Invalid(absl::StrCat("range ", i, " has offset ", r.offset, " and length ", r.length,
                                  "; both must be >= 0"));
    }
    // Written so that offset + length cannot overflow.
    if (r.offset > numel || r.length > numel - r.offset) {
      return Invalid(absl::StrCat("range ", i, " (offset ", r.offset, ", length ", r.length,
                                  ") lies outside the ", numel, " elements of the buffers"));
    }
    if (r.length > 0) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ranges[a].offset < ranges[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const ParamRange& prev = ranges[order[k - 1]];
    const ParamRange& cur = ranges[order[k]];
    if (cur.offset < prev.offset + prev.length) {
      return Invalid(absl::StrCat(RangeString(order[k - 1], prev), " and ",
                                  RangeString(order[k], cur), " overlap"));
    }
  }
  return order;
}

// Appends r to merged, extending the last entry instead when r starts where it ends and
// `same_group` says they may share one call.
template <typename SameGroup>
void AppendMerged(std::vector<ParamRange>& merged, const ParamRange& r, SameGroup same_group) {
  if (!merged.empty() && merged.back().offset + merged.back().length == r.offset &&
      same_group(merged.back(), r)) {
    merged.back().length += r.length;
  } else {
    merged.push_back(r);
  }
}

absl::StatusOr<Tensor> ZerosOn(Allocator& allocator, DType dtype, int64_t numel) {
  NF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(dtype, {numel}, allocator));
  NF_RETURN_IF_ERROR(ops::Fill(t, 0.0f));
  return t;
}

// The value of an f32 [1] result (copied back, and so waited for, from a device).
absl::StatusOr<float> ReadScalar(const Tensor& scalar) {
  NF_ASSIGN_OR_RETURN(const Tensor host, ops::OnHost(scalar));
  return host.data<float>()[0];
}

}  // namespace

absl::string_view SkipReasonName(SkipReason reason) {
  switch (reason) {
    case SkipReason::kNone:
      return "none";
    case SkipReason::kNonFiniteGradients:
      return "nonfinite_grads";
    case SkipReason::kUpdateOverflow:
      return "update_overflow";
    case SkipReason::kSpike:
      return "spike";
    case SkipReason::kSkippedData:
      return "skipped_data";
  }
  return "unknown";
}

absl::Status Validate(const AdamWConfig& c) {
  auto invalid = [](absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat("AdamWConfig: ", message));
  };
  if (!(c.beta1 >= 0 && c.beta1 < 1)) {
    return invalid(absl::StrCat("beta1 must be in [0, 1), got ", c.beta1));
  }
  if (!(c.beta2 >= 0 && c.beta2 < 1)) {
    return invalid(absl::StrCat("beta2 must be in [0, 1), got ", c.beta2));
  }
  if (!std::isfinite(c.eps) || !(c.eps > 0)) {
    return invalid(absl::StrCat("eps must be finite and > 0, got ", c.eps));
  }
  if (!std::isfinite(c.weight_decay) || c.weight_decay < 0) {
    return invalid(absl::StrCat("weight_decay must be finite and >= 0, got ", c.weight_decay));
  }
  if (!std::isfinite(c.clip_grad) || c.clip_grad < 0) {
    return invalid(absl::StrCat("clip_grad must be finite and >= 0 (0 turns clipping off), got ",
                                c.clip_grad));
  }
  return absl::OkStatus();
}

absl::StatusOr<MixedPrecisionAdamW> MixedPrecisionAdamW::Create(Tensor model_params, Tensor grads,
                                                                std::vector<ParamRange> ranges,
                                                                const AdamWConfig& config,
                                                                Allocator& allocator) {
  NF_RETURN_IF_ERROR(Validate(config));
  NF_RETURN_IF_ERROR(ops::CheckFloating(kName, {"model_params", model_params}));
  NF_RETURN_IF_ERROR(CheckFlat(model_params, "model_params"));
  NF_RETURN_IF_ERROR(ops::CheckDefined(kName, {"grads", grads}));
  NF_RETURN_IF_ERROR(ops::CheckDType(kName, {"grads", grads}, DType::kF32));
  NF_RETURN_IF_ERROR(ops::CheckShape(kName, {"grads", grads}, model_params.shape()));
  NF_RETURN_IF_ERROR(
      ops::CheckSameDevice(kName, {{"model_params", model_params}, {"grads", grads}}));
  if (allocator.device() != model_params.device()) {
    return Invalid(absl::StrCat("the allocator is for ", allocator.device().ToString(),
                                " but model_params is on ", model_params.device().ToString()));
  }
  const int64_t numel = model_params.numel();
  NF_ASSIGN_OR_RETURN(std::vector<size_t> order, SortedValidRanges(ranges, numel));

  MixedPrecisionAdamW opt;
  opt.config_ = config;
  opt.model_params_ = std::move(model_params);
  opt.grads_ = std::move(grads);
  opt.master_is_model_ = opt.model_params_.dtype() == DType::kF32;
  if (opt.master_is_model_) {
    opt.master_ = opt.model_params_;
  } else {
    NF_ASSIGN_OR_RETURN(opt.master_, Tensor::Empty(DType::kF32, {numel}, allocator));
  }
  NF_ASSIGN_OR_RETURN(opt.exp_avg_, ZerosOn(allocator, DType::kF32, numel));
  NF_ASSIGN_OR_RETURN(opt.exp_avg_sq_, ZerosOn(allocator, DType::kF32, numel));
  NF_ASSIGN_OR_RETURN(opt.scalar_, ZerosOn(allocator, DType::kF32, 1));

  std::vector<ParamRange> spans;
  for (size_t i : order) {
    AppendMerged(opt.merged_ranges_, ranges[i], [](const ParamRange& a, const ParamRange& b) {
      return a.weight_decay == b.weight_decay;
    });
    AppendMerged(spans, ranges[i], [](const ParamRange&, const ParamRange&) { return true; });
  }
  for (const ParamRange& r : opt.merged_ranges_) {
    NF_ASSIGN_OR_RETURN(Tensor master, opt.master_.View(r.offset, {r.length}));
    NF_ASSIGN_OR_RETURN(Tensor grads_view, opt.grads_.View(r.offset, {r.length}));
    NF_ASSIGN_OR_RETURN(Tensor exp_avg, opt.exp_avg_.View(r.offset, {r.length}));
    NF_ASSIGN_OR_RETURN(Tensor exp_avg_sq, opt.exp_avg_sq_.View(r.offset, {r.length}));
    opt.groups_.push_back({.master = std::move(master),
                           .grads = std::move(grads_view),
                           .exp_avg = std::move(exp_avg),
                           .exp_avg_sq = std::move(exp_avg_sq),
                           .weight_decay = r.weight_decay});
  }
  for (const ParamRange& r : spans) {
    NF_ASSIGN_OR_RETURN(Tensor grads_view, opt.grads_.View(r.offset, {r.length}));
    NF_ASSIGN_OR_RETURN(Tensor master, opt.master_.View(r.offset, {r.length}));
    NF_ASSIGN_OR_RETURN(Tensor model, opt.model_params_.View(r.offset, {r.length}));
    opt.spans_.push_back(
        {.grads = std::move(grads_view), .master = std::move(master), .model = std::move(model)});
  }
  return opt;
}

absl::Status MixedPrecisionAdamW::InitializeMasterFromModel() {
  if (master_is_model_) return absl::OkStatus();
  return ops::Cast(model_params_, master_);
}

absl::StatusOr<bool> MixedPrecisionAdamW::UnscaleAndCheck(float loss_scale) {
  if (!std::isfinite(loss_scale) || !(loss_scale > 0)) {
    return Invalid(absl::StrCat("loss_scale must be finite and > 0, got ", loss_scale));
  }
  NF_RETURN_IF_ERROR(ops::Fill(scalar_, 0.0f));
  for (const Span& s : spans_) {
    NF_RETURN_IF_ERROR(ops::UnscaleAndCheck(s.grads, 1.0f / loss_scale, scalar_));
  }
  NF_ASSIGN_OR_RETURN(const float flag, ReadScalar(scalar_));
  return flag != 0.0f;
}

absl::StatusOr<double> MixedPrecisionAdamW::SquaredGradNorm() {
  NF_RETURN_IF_ERROR(ops::Fill(scalar_, 0.0f));
  for (const Span& s : spans_) NF_RETURN_IF_ERROR(ops::SquaredNorm(s.grads, scalar_));
  NF_ASSIGN_OR_RETURN(const float sum, ReadScalar(scalar_));
  return static_cast<double>(sum);
}

absl::Status MixedPrecisionAdamW::CheckUpdateArgs(absl::string_view stage, float lr,
                                                  double grad_norm) const {
  if (!std::isfinite(lr) || lr < 0) {
    return Invalid(absl::StrCat(stage, ": lr must be finite and >= 0, got ", lr));
  }
  if (!std::isfinite(grad_norm) || grad_norm < 0) {
    return Invalid(absl::StrCat(stage, ": grad_norm must be finite and >= 0, got ", grad_norm,
                                " (skip the step when gradients are not finite)"));
  }
  return absl::OkStatus();
}

float MixedPrecisionAdamW::ClipCoefficient(double grad_norm) const {
  if (config_.clip_grad > 0 && grad_norm > config_.clip_grad) {
    // Megatron's and fairseq's coefficient; the 1e-6 keeps it below 1 for norms a hair above
    // the threshold.
    return static_cast<float>(config_.clip_grad / (grad_norm + 1e-6));
  }
  return 1.0f;
}

ops::AdamWArgs MixedPrecisionAdamW::AdamWArgsOf(const DecayGroup& g, float lr, int64_t step) const {
  return {.params = g.master,
          .grads = g.grads,
          .exp_avg = g.exp_avg,
          .exp_avg_sq = g.exp_avg_sq,
          .lr = lr,
          .beta1 = config_.beta1,
          .beta2 = config_.beta2,
          .eps = config_.eps,
          .weight_decay = g.weight_decay ? config_.weight_decay : 0.0f,
          .step = step};
}

absl::StatusOr<bool> MixedPrecisionAdamW::UpdateWouldOverflow(float lr, double grad_norm) {
  NF_RETURN_IF_ERROR(CheckUpdateArgs("UpdateWouldOverflow", lr, grad_norm));
  // Update scales the grads by this factor in place (when it is not 1) before AdamW reads
  // them; the check multiplies as it reads instead, which rounds identically.
  const float coef = ClipCoefficient(grad_norm);
  NF_RETURN_IF_ERROR(ops::Fill(scalar_, 0.0f));
  for (const DecayGroup& g : groups_) {
    NF_RETURN_IF_ERROR(ops::AdamWWouldOverflow(AdamWArgsOf(g, lr, updates_ + 1), coef,
                                               model_params_.dtype(), scalar_));
  }
  NF_ASSIGN_OR_RETURN(const float flag, ReadScalar(scalar_));
  return flag != 0.0f;
}

absl::Status MixedPrecisionAdamW::Update(float lr, double grad_norm) {
  NF_RETURN_IF_ERROR(CheckUpdateArgs("Update", lr, grad_norm));
  const float coef = ClipCoefficient(grad_norm);
  if (coef != 1.0f) {
    for (const Span& s : spans_) NF_RETURN_IF_ERROR(ops::Scale(s.grads, coef));
  }
  ++updates_;
  for (const DecayGroup& g : groups_) {
    NF_RETURN_IF_ERROR(ops::AdamWStep(AdamWArgsOf(g, lr, updates_)));
  }
  if (!master_is_model_) {
    for (const Span& s : spans_) NF_RETURN_IF_ERROR(ops::Cast(s.master, s.model));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> MixedPrecisionAdamW::UnscaledSquaredGradNorm(float loss_scale) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  if (loss_scale != 1.0f) {
    NF_ASSIGN_OR_RETURN(const bool nonfinite, UnscaleAndCheck(loss_scale));
    if (nonfinite) return kNaN;
    return SquaredGradNorm();
  }
  // Unscaling by 1 changes nothing, and a sum of squares is finite only when every term is:
  // the norm's pass alone clears the gradients, and the check runs only on a non-finite sum.
  NF_ASSIGN_OR_RETURN(const double squared, SquaredGradNorm());
  if (std::isfinite(squared)) return squared;
  NF_ASSIGN_OR_RETURN(const bool nonfinite, UnscaleAndCheck(loss_scale));
  return nonfinite ? kNaN : squared;
}

absl::StatusOr<StepResult> MixedPrecisionAdamW::Step(float lr, float loss_scale) {
  NF_ASSIGN_OR_RETURN(const double squared, UnscaledSquaredGradNorm(loss_scale));
  if (std::isnan(squared)) {
    return StepResult{
        .skipped = true, .reason = SkipReason::kNonFiniteGradients, .grad_norm = squared};
  }
  const double norm = std::sqrt(squared);
  // Finite gradients whose squares overflow the fp32 accumulator: as good as an overflow.
  if (!std::isfinite(norm)) {
    return StepResult{
        .skipped = true, .reason = SkipReason::kNonFiniteGradients, .grad_norm = norm};
  }
  NF_ASSIGN_OR_RETURN(const bool overflow, UpdateWouldOverflow(lr, norm));
  if (overflow) {
    return StepResult{.skipped = true, .reason = SkipReason::kUpdateOverflow, .grad_norm = norm};
  }
  NF_RETURN_IF_ERROR(Update(lr, norm));
  return StepResult{.skipped = false, .grad_norm = norm};
}

absl::Status MixedPrecisionAdamW::SetUpdates(int64_t updates) {
  if (updates < 0) return Invalid(absl::StrCat("SetUpdates: updates must be >= 0, got ", updates));
  updates_ = updates;
  return absl::OkStatus();
}

}  // namespace nf::optim
