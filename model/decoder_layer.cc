#include "model/decoder_layer.h"

#include <cmath>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "core/ops/nonfinite_trace.h"
#include "core/status.h"
#include "core/trace_range.h"

namespace nf::model {
namespace {

absl::Status LayerNorm(const Tensor& x, const Param& weight, const Param& bias, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, float eps) {
  return ops::LayerNormForward({.x = x,
                                .weight = weight.value,
                                .bias = bias.value,
                                .y = y,
                                .mean = mean,
                                .rstd = rstd,
                                .eps = eps});
}

absl::Status LayerNormGrad(const Tensor& dy, const Tensor& x, const Param& weight,
                           const Param& bias, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dx) {
  return ops::LayerNormBackward({.dy = dy,
                                 .x = x,
                                 .weight = weight.value,
                                 .mean = mean,
                                 .rstd = rstd,
                                 .dx = dx,
                                 .dweight = weight.grad,
                                 .dbias = bias.grad});
}

}  // namespace

uint32_t DropoutSite(int layer, DropoutKind kind) {
  return 1 + 4 * static_cast<uint32_t>(layer) + static_cast<uint32_t>(kind);
}

namespace {

// Whether tensor parallelism splits LN_ffn_mid's row across ranks (its statistics all-reduced).
bool FfnNormIsSharded(const LayerShape& s) { return s.ffn != s.ffn_total; }

// *views[g] = group g of grouped [G, ...] (G = views.size()), as a [...] tensor.
absl::Status ViewGroups(const Tensor& grouped, std::initializer_list<Tensor*> views) {
  const Shape& shape = grouped.shape();
  const Shape group(shape.begin() + 1, shape.end());
  int64_t g = 0;
  for (Tensor* view : views) {
    NF_ASSIGN_OR_RETURN(*view, grouped.View(g++ * NumElements(group), group));
  }
  return absl::OkStatus();
}

// The activations of one layer, each tensor made by new_tensor(dtype, shape): Allocate makes
// them, Bytes counts them (aliases are views, counted once).
template <typename NewTensor>
absl::StatusOr<LayerActivations> MakeActivations(const LayerShape& s, const LayerOptions& options,
                                                 NewTensor&& New) {
  const int64_t t = s.tokens(), ts = s.shard_tokens();
  const DType dt = s.dtype, f32 = DType::kF32;
  const Shape heads{s.batch, s.heads, s.seq, s.head_dim};
  LayerActivations a;
  NF_ASSIGN_OR_RETURN(a.attn_in_norm, New(dt, {ts, s.d_model}));
  NF_ASSIGN_OR_RETURN(a.attn_in_mean, New(f32, {ts}));
  NF_ASSIGN_OR_RETURN(a.attn_in_rstd, New(f32, {ts}));
  NF_ASSIGN_OR_RETURN(a.qkv, New(dt, {3, s.batch, s.heads, s.seq, s.head_dim}));
  if (a.qkv.defined()) {  // (counting bytes makes no tensors)
    NF_RETURN_IF_ERROR(ViewGroups(a.qkv, {&a.q, &a.k, &a.v}));
  }
  if (!options.recompute_attention) {
    NF_ASSIGN_OR_RETURN(a.attn, New(dt, heads));
    NF_ASSIGN_OR_RETURN(a.lse, New(f32, {s.batch, s.heads, s.seq}));
    NF_ASSIGN_OR_RETURN(a.merged, New(dt, {t, s.local_width()}));
  }
  NF_ASSIGN_OR_RETURN(a.attn_proj, New(dt, {ts, s.d_model}));
  // Without the after-projection head scale, LN_post_attn reads out_proj's output directly.
  const bool scale_after = options.scale_heads && !options.heads_before_out_proj;
  if (scale_after) {
    NF_ASSIGN_OR_RETURN(a.post_attn, New(dt, {ts, s.d_model}));
  } else {
    a.post_attn = a.attn_proj;
  }
  NF_ASSIGN_OR_RETURN(a.post_attn_mean, New(f32, {ts}));
  NF_ASSIGN_OR_RETURN(a.post_attn_rstd, New(f32, {ts}));
  NF_ASSIGN_OR_RETURN(a.residual, New(dt, {ts, s.d_model}));
  NF_ASSIGN_OR_RETURN(a.ffn_in_norm, New(dt, {ts, s.d_model}));
  NF_ASSIGN_OR_RETURN(a.ffn_in_mean, New(f32, {ts}));
  NF_ASSIGN_OR_RETURN(a.ffn_in_rstd, New(f32, {ts}));
  NF_ASSIGN_OR_RETURN(a.fc1_out, New(dt, {t, s.ffn}));
  // The activation's output is kept where something reads it later: fc2 without LN_ffn_mid, the
  // sharded LN_ffn_mid's backward. The whole LN_ffn_mid recomputes it (ops::ActivationNorm).
  if (!options.scale_fc || FfnNormIsSharded(s)) {
    NF_ASSIGN_OR_RETURN(a.act_out, New(dt, {t, s.ffn}));
  }
  NF_ASSIGN_OR_RETURN(a.mid_mean, New(f32, {t}));
  NF_ASSIGN_OR_RETURN(a.mid_rstd, New(f32, {t}));
  if (options.scale_fc) {
    NF_ASSIGN_OR_RETURN(a.fc2_in, New(dt, {t, s.ffn}));
  } else {
    a.fc2_in = a.act_out;
  }
  return a;
}

// The scratch of the layers, each tensor made by New as in MakeActivations.
template <typename NewTensor>
absl::StatusOr<LayerScratch> MakeScratch(const LayerShape& s, const LayerOptions& options,
                                         NewTensor&& New) {
  LayerScratch scratch;
  NF_ASSIGN_OR_RETURN(scratch.qkv_tokens, New(s.dtype, {s.tokens(), 3 * s.local_width()}));
  if (options.recompute_attention) {
    NF_ASSIGN_OR_RETURN(scratch.attn, New(s.dtype, {s.batch, s.heads, s.seq, s.head_dim}));
    NF_ASSIGN_OR_RETURN(scratch.lse, New(DType::kF32, {s.batch, s.heads, s.seq}));
    NF_ASSIGN_OR_RETURN(scratch.merged, New(s.dtype, {s.tokens(), s.local_width()}));
  }
  // The forward uses model_width[0..1] and ffn_width[0]; the backward all of them.
  const int model_widths = options.backward ? 4 : 2, ffn_widths = options.backward ? 3 : 1;
  for (int i = 0; i < model_widths; ++i) {
    NF_ASSIGN_OR_RETURN(scratch.model_width[i], New(s.dtype, {s.shard_tokens(), s.d_model}));
  }
  if (s.sequence_parallel()) {
    NF_ASSIGN_OR_RETURN(scratch.region.gathered, New(s.dtype, {s.tokens(), s.d_model}));
    NF_ASSIGN_OR_RETURN(scratch.region.partials, New(s.dtype, {s.tokens(), s.d_model}));
  }
  for (int i = 0; i < ffn_widths; ++i) {
    NF_ASSIGN_OR_RETURN(scratch.ffn_width[i], New(s.dtype, {s.tokens(), s.ffn}));
  }
  NF_ASSIGN_OR_RETURN(scratch.row_stats, New(DType::kF64, {s.tokens(), 2}));
  if (!options.backward) return scratch;
  NF_ASSIGN_OR_RETURN(scratch.merged_grad, New(s.dtype, {s.tokens(), s.local_width()}));
  NF_ASSIGN_OR_RETURN(scratch.d_attn, New(s.dtype, {s.batch, s.heads, s.seq, s.head_dim}));
  NF_ASSIGN_OR_RETURN(scratch.d_qkv, New(s.dtype, {3, s.batch, s.heads, s.seq, s.head_dim}));
  if (scratch.d_qkv.defined()) {
    NF_RETURN_IF_ERROR(ViewGroups(scratch.d_qkv, {&scratch.dq, &scratch.dk, &scratch.dv}));
  }
  NF_ASSIGN_OR_RETURN(scratch.row_sums, New(DType::kF32, {s.tokens(), 2}));
  return scratch;
}

// The bytes of what make(count) makes, count adding each tensor's instead of making it.
template <typename Make>
int64_t CountBytes(Make&& make) {
  int64_t bytes = 0;
  static const Tensor kCounted;  // what counting "makes"
  const auto count = [&bytes](DType dtype, const Shape& dims) -> absl::StatusOr<Tensor> {
    bytes += NumElements(dims) * static_cast<int64_t>(SizeOf(dtype));
    return kCounted;
  };
  (void)make(count);  // counting cannot fail
  return bytes;
}

}  // namespace

absl::StatusOr<LayerActivations> LayerActivations::Allocate(const LayerShape& shape,
                                                            const LayerOptions& options) {
  return MakeActivations(shape, options, [&shape](DType dtype, Shape dims) {
    return ops::Zeros(dtype, std::move(dims), shape.device);
  });
}

int64_t LayerActivations::Bytes(const LayerShape& shape, const LayerOptions& options) {
  return CountBytes([&](auto&& count) { return MakeActivations(shape, options, count); });
}

absl::StatusOr<LayerScratch> LayerScratch::Allocate(const LayerShape& shape,
                                                    const LayerOptions& options) {
  return MakeScratch(shape, options, [&shape](DType dtype, Shape dims) {
    return ops::Zeros(dtype, std::move(dims), shape.device);
  });
}

int64_t LayerScratch::Bytes(const LayerShape& shape, const LayerOptions& options) {
  return CountBytes([&](auto&& count) { return MakeScratch(shape, options, count); });
}

ops::DropoutSpec DecoderLayer::Dropout(DropoutKind kind, const Step& step) const {
  float p = 0.0f;
  int64_t token_offset = 0, col_offset = 0;
  switch (kind) {
    case DropoutKind::kAttentionProbs:
      p = options_.attention_dropout;
      break;
    case DropoutKind::kAttention:
    case DropoutKind::kFfn:
      p = options_.dropout;
      token_offset = shape_.first_token();  // [Ts, d] rows are tokens first_token + t
      break;
    case DropoutKind::kActivation:
      p = options_.activation_dropout;
      col_offset = shape_.ffn_offset;  // [T, F_local] columns are global ffn features
      break;
  }
  return {.p = step.train ? p : 0.0f,
          .seed = step.seed,
          .site = DropoutSite(index_, kind),
          .first_sample = step.first_sample,
          .seq_len = shape_.seq,
          .token_offset = token_offset,
          .col_offset = col_offset,
          .head_offset = shape_.head_offset};
}

DecoderLayer::AttentionCore DecoderLayer::CoreOf(const LayerActivations& acts,
                                                 const LayerScratch& scratch) const {
  if (options_.recompute_attention) return {scratch.attn, scratch.lse, scratch.merged};
  return {acts.attn, acts.lse, acts.merged};
}

absl::Status DecoderLayer::AttentionCoreForward(const LayerActivations& acts,
                                                const AttentionCore& core, const Step& step,
                                                const LayerKvCache* cache) const {
  const float attention_scale =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape_.head_dim)));
  if (cache != nullptr) {
    if (step.train) return absl::InvalidArgumentError("a KV-cache forward cannot train");
    if (!options_.causal) {
      return absl::InvalidArgumentError(
          "a KV-cache forward decodes causally, and this layer's attention is bidirectional (a "
          "masked LM)");
    }
    NF_RETURN_IF_ERROR(ops::KvCacheAttention({.q = acts.q,
                                              .k = acts.k,
                                              .v = acts.v,
                                              .k_cache = cache->k,
                                              .v_cache = cache->v,
                                              .out = core.attn,
                                              .past = cache->past,
                                              .scale = attention_scale}));
  } else {
    NF_RETURN_IF_ERROR(
        ops::AttentionForward({.q = acts.q,
                               .k = acts.k,
                               .v = acts.v,
                               .out = core.attn,
                               .lse = core.lse,
                               .scale = attention_scale,
                               .dropout = Dropout(DropoutKind::kAttentionProbs, step),
                               .causal = options_.causal}));
  }
  if (options_.scale_heads && options_.heads_before_out_proj) {
    // Each head's output times its scale on the way to token order.
    return ops::MergeScaledHeads(core.attn, params_.head_scale.value, core.merged);
  }
  return ops::MergeHeads(core.attn, core.merged);
}

absl::Status DecoderLayer::Forward(const Tensor& x, const Tensor& y, const Step& step,
                                   LayerActivations& acts, LayerScratch& scratch,
                                   const LayerKvCache* cache) const {
  const TraceRange trace(absl::StrCat("layer ", index_, " forward"));
  const LayerParams& p = params_;
  const LayerShape& s = shape_;
  const float eps = options_.eps;
  if (cache != nullptr && s.sequence_parallel()) {
    return absl::FailedPreconditionError(
        "a KV-cache forward runs without sequence parallelism (its steps hold too few tokens)");
  }
  // Where the NaN-origin re-run names its findings (core/ops/nonfinite_trace.h).
  const ops::OpLabel layer("layer", index_);
  ops::OpLabel part("attn_norm");
  // ---- attention block
  NF_RETURN_IF_ERROR(LayerNorm(x, p.attn_norm_weight, p.attn_norm_bias, acts.attn_in_norm,
                               acts.attn_in_mean, acts.attn_in_rstd, eps));
  // q, k and v in one GEMM, [T, 3 H Dh], then to the head layout: acts.qkv [3, B, H, S, Dh].
  part.Rename("qkv");
  NF_RETURN_IF_ERROR(ColumnParallelLinearForward(region_, acts.attn_in_norm, p.qkv_weight,
                                                 p.qkv_bias, scratch.qkv_tokens, scratch.region));
  NF_RETURN_IF_ERROR(ops::SplitHeads(scratch.qkv_tokens, acts.qkv));
  const AttentionCore core = CoreOf(acts, scratch);
  part.Rename("attention");
  NF_RETURN_IF_ERROR(AttentionCoreForward(acts, core, step, cache));
  const bool scale_after = options_.scale_heads && !options_.heads_before_out_proj;
  part.Rename("out_proj");
  NF_RETURN_IF_ERROR(RowParallelLinearForward(region_, core.merged, p.out_weight, p.out_bias,
                                              acts.attn_proj, scratch.region));
  if (scale_after) {
    // [T, H, Dh]: the projection's output viewed as heads.
    part.Rename("head_scale");
    NF_RETURN_IF_ERROR(
        ops::ScaleChannels(acts.attn_proj, p.head_scale.value, s.head_dim, acts.post_attn));
  }
  // residual = x + dropout(LN_post_attn(post_attn)), and the feed-forward block's input
  // LayerNorm of it, in one op.
  ops::ResidualNormArgs residual_norm{.dropout = Dropout(DropoutKind::kAttention, step),
                                      .x = x,
                                      .branch = acts.post_attn,
                                      .residual = acts.residual,
                                      .weight = p.ffn_norm_weight.value,
                                      .bias = p.ffn_norm_bias.value,
                                      .y = acts.ffn_in_norm,
                                      .mean = acts.ffn_in_mean,
                                      .rstd = acts.ffn_in_rstd,
                                      .scratch = scratch.model_width[0],
                                      .eps = eps};
  if (options_.scale_attn) {
    residual_norm.branch_weight = p.post_attn_norm_weight.value;
    residual_norm.branch_bias = p.post_attn_norm_bias.value;
    residual_norm.branch_mean = acts.post_attn_mean;
    residual_norm.branch_rstd = acts.post_attn_rstd;
  }
  part.Rename("post_attn_norm, residual, ffn_norm");
  NF_RETURN_IF_ERROR(ops::ResidualNormForward(residual_norm));

  // ---- feed-forward block
  part.Rename("fc1");
  NF_RETURN_IF_ERROR(ColumnParallelLinearForward(region_, acts.ffn_in_norm, p.fc1_weight,
                                                 p.fc1_bias, acts.fc1_out, scratch.region));
  part.Rename("activation, mid_ffn_norm");
  if (options_.scale_fc && !FfnNormIsSharded(s)) {
    NF_RETURN_IF_ERROR(
        ops::ActivationNormForward({.act = options_.activation,
                                    .dropout = Dropout(DropoutKind::kActivation, step),
                                    .x = acts.fc1_out,
                                    .weight = p.mid_ffn_norm_weight.value,
                                    .bias = p.mid_ffn_norm_bias.value,
                                    .y = acts.fc2_in,
                                    .mean = acts.mid_mean,
                                    .rstd = acts.mid_rstd,
                                    .scratch = scratch.ffn_width[0],
                                    .eps = eps}));
  } else {
    NF_RETURN_IF_ERROR(ops::ActivationForward(options_.activation, acts.fc1_out, acts.act_out));
    NF_RETURN_IF_ERROR(
        ops::Dropout(acts.act_out, acts.act_out, Dropout(DropoutKind::kActivation, step)));
  }
  if (options_.scale_fc && FfnNormIsSharded(s)) {
    NF_RETURN_IF_ERROR(ShardedLayerNormForward({.x = acts.act_out,
                                                .weight = p.mid_ffn_norm_weight.value,
                                                .bias = p.mid_ffn_norm_bias.value,
                                                .y = acts.fc2_in,
                                                .mean = acts.mid_mean,
                                                .rstd = acts.mid_rstd,
                                                .eps = eps},
                                               s.ffn_total, scratch.row_stats, region_.tp()));
  }
  const Tensor& ffn_out = scratch.model_width[1];
  part.Rename("fc2");
  NF_RETURN_IF_ERROR(RowParallelLinearForward(region_, acts.fc2_in, p.fc2_weight, p.fc2_bias,
                                              ffn_out, scratch.region));
  part.Rename("residual");
  NF_RETURN_IF_ERROR(ops::Dropout(ffn_out, ffn_out, Dropout(DropoutKind::kFfn, step)));
  if (options_.scale_resids) {
    NF_RETURN_IF_ERROR(ops::ScaleChannels(acts.residual, p.resid_scale.value, 1, y));
  } else {
    NF_RETURN_IF_ERROR(ops::Cast(acts.residual, y));
  }
  return ops::Axpy(1.0f, ffn_out, y);
}

absl::Status DecoderLayer::Backward(const Tensor& x, const Tensor& dy, const Tensor& dx,
                                    const Step& step, const LayerActivations& acts,
                                    LayerScratch& scratch) const {
  const TraceRange trace(absl::StrCat("layer ", index_, " backward"));
  const LayerParams& p = params_;
  const LayerShape& s = shape_;
  const Tensor& d_residual = scratch.model_width[0];  // grad of acts.residual, accumulated
  const Tensor& d_model = scratch.model_width[1];
  const Tensor& d_model_aux = scratch.model_width[2];

  const ops::OpLabel layer("layer", index_);
  ops::OpLabel part("residual");
  // ---- feed-forward block: y = lambda * residual + dropout(fc2(...))
  if (options_.scale_resids) {
    NF_RETURN_IF_ERROR(ops::ScaleChannelsBackward(acts.residual, p.resid_scale.value, 1, dy,
                                                  d_residual, p.resid_scale.grad));
  } else {
    NF_RETURN_IF_ERROR(ops::Cast(dy, d_residual));
  }
  NF_RETURN_IF_ERROR(ops::Dropout(dy, d_model, Dropout(DropoutKind::kFfn, step)));
  const Tensor& d_fc2_in = scratch.ffn_width[0];
  part.Rename("fc2");
  NF_RETURN_IF_ERROR(RowParallelLinearBackward(region_, acts.fc2_in, p.fc2_weight, p.fc2_bias,
                                               d_model, d_fc2_in, scratch.region));
  const Tensor& d_act = options_.scale_fc ? scratch.ffn_width[1] : d_fc2_in;
  part.Rename("activation, mid_ffn_norm");
  if (options_.scale_fc && !FfnNormIsSharded(s)) {
    NF_RETURN_IF_ERROR(
        ops::ActivationNormBackward({.act = options_.activation,
                                     .dropout = Dropout(DropoutKind::kActivation, step),
                                     .dy = d_fc2_in,
                                     .x = acts.fc1_out,
                                     .weight = p.mid_ffn_norm_weight.value,
                                     .mean = acts.mid_mean,
                                     .rstd = acts.mid_rstd,
                                     .dx = d_act,
                                     .dweight = p.mid_ffn_norm_weight.grad,
                                     .dbias = p.mid_ffn_norm_bias.grad,
                                     .scratch = scratch.ffn_width[2]}));
  } else {
    if (options_.scale_fc) {
      NF_RETURN_IF_ERROR(ShardedLayerNormBackward({.dy = d_fc2_in,
                                                   .x = acts.act_out,
                                                   .weight = p.mid_ffn_norm_weight.value,
                                                   .mean = acts.mid_mean,
                                                   .rstd = acts.mid_rstd,
                                                   .dx = d_act,
                                                   .dweight = p.mid_ffn_norm_weight.grad,
                                                   .dbias = p.mid_ffn_norm_bias.grad},
                                                  s.ffn_total, scratch.row_sums, region_.tp()));
    }
    NF_RETURN_IF_ERROR(ops::Dropout(d_act, d_act, Dropout(DropoutKind::kActivation, step)));
    NF_RETURN_IF_ERROR(ops::ActivationBackward(options_.activation, acts.fc1_out, d_act, d_act));
  }
  part.Rename("fc1");
  NF_RETURN_IF_ERROR(ColumnParallelLinearBackward(region_, acts.ffn_in_norm, p.fc1_weight,
                                                  p.fc1_bias, d_act, d_model, scratch.region));

  // ---- attention block: residual = x + dropout(LN_post_attn(scaled out_proj(...)))
  // d_residual gains the FFN input LayerNorm's input gradient; d_post_attn is the branch's.
  const Tensor& d_post_attn = d_model_aux;
  ops::ResidualNormBackwardArgs residual_norm{.dropout = Dropout(DropoutKind::kAttention, step),
                                              .dy = d_model,
                                              .residual = acts.residual,
                                              .weight = p.ffn_norm_weight.value,
                                              .mean = acts.ffn_in_mean,
                                              .rstd = acts.ffn_in_rstd,
                                              .branch = acts.post_attn,
                                              .d_residual = d_residual,
                                              .d_branch = d_post_attn,
                                              .dweight = p.ffn_norm_weight.grad,
                                              .dbias = p.ffn_norm_bias.grad,
                                              .scratch = scratch.model_width[3]};
  if (options_.scale_attn) {
    residual_norm.branch_weight = p.post_attn_norm_weight.value;
    residual_norm.branch_mean = acts.post_attn_mean;
    residual_norm.branch_rstd = acts.post_attn_rstd;
    residual_norm.d_branch_weight = p.post_attn_norm_weight.grad;
    residual_norm.d_branch_bias = p.post_attn_norm_bias.grad;
  }
  part.Rename("post_attn_norm, residual, ffn_norm");
  NF_RETURN_IF_ERROR(ops::ResidualNormBackward(residual_norm));
  // The attention output and the merged heads, kept by the forward or (selective recompute)
  // computed again from q, k and v: deterministic kernels and dropout keyed by coordinates give
  // the forward's values bit for bit.
  const AttentionCore core = CoreOf(acts, scratch);
  if (options_.recompute_attention) {
    part.Rename("attention (recomputed)");
    NF_RETURN_IF_ERROR(AttentionCoreForward(acts, core, step, /*cache=*/nullptr));
  }
  const bool scale_before = options_.scale_heads && options_.heads_before_out_proj;
  const bool scale_after = options_.scale_heads && !options_.heads_before_out_proj;
  if (scale_after) {  // in place: d_post_attn becomes the grad of out_proj's output
    part.Rename("head_scale");
    NF_RETURN_IF_ERROR(ops::ScaleChannelsBackward(acts.attn_proj, p.head_scale.value, s.head_dim,
                                                  d_post_attn, d_post_attn, p.head_scale.grad));
  }
  const Tensor& d_merged = scratch.merged_grad;
  part.Rename("out_proj");
  NF_RETURN_IF_ERROR(RowParallelLinearBackward(region_, core.merged, p.out_weight, p.out_bias,
                                               d_post_attn, d_merged, scratch.region));
  const Tensor& d_attn = scratch.d_attn;
  part.Rename("attention");
  if (scale_before) {
    NF_RETURN_IF_ERROR(ops::MergeScaledHeadsBackward(d_merged, core.attn, p.head_scale.value,
                                                     d_attn, p.head_scale.grad));
  } else {
    NF_RETURN_IF_ERROR(ops::SplitHeads(d_merged, d_attn));
  }
  NF_RETURN_IF_ERROR(ops::AttentionBackward(
      {.q = acts.q,
       .k = acts.k,
       .v = acts.v,
       .out = core.attn,
       .lse = core.lse,
       .dout = d_attn,
       .dq = scratch.dq,
       .dk = scratch.dk,
       .dv = scratch.dv,
       .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim))),
       .dropout = Dropout(DropoutKind::kAttentionProbs, step),
       .causal = options_.causal}));
  // [3, B, H, S, Dh] back to [T, 3 H Dh], then the one projection's backward.
  part.Rename("qkv");
  NF_RETURN_IF_ERROR(ops::MergeHeads(scratch.d_qkv, scratch.qkv_tokens));
  NF_RETURN_IF_ERROR(ColumnParallelLinearBackward(region_, acts.attn_in_norm, p.qkv_weight,
                                                  p.qkv_bias, scratch.qkv_tokens, d_model,
                                                  scratch.region));
  part.Rename("attn_norm");
  NF_RETURN_IF_ERROR(LayerNormGrad(d_model, x, p.attn_norm_weight, p.attn_norm_bias,
                                   acts.attn_in_mean, acts.attn_in_rstd, dx));
  return ops::Axpy(1.0f, d_residual, dx);
}

}  // namespace nf::model
