// The op table: every tensor operation of normformer, declared once. Each function checks
// shapes, dtypes and devices (errors name the op and the offending tensor), then runs the
// backend of the tensors' device (core/cpu today, core/cuda with the CUDA issue).
//
// Conventions
// - Outputs are passed in pre-allocated (no allocation on the hot path) and written through
//   const Tensor& handles.
// - Floating inputs may be fp32, fp16 or bf16; arithmetic, statistics and accumulation are
//   fp32 (the CPU backend accumulates long sums in double, which only makes it a better
//   reference).
// - Parameter gradients (dweight, dbias, dtable) are fp32 and ACCUMULATED (+=), so gradient
//   accumulation over micro-batches needs no extra op; zero them with Fill at step start.
// - "rows" means every dimension but the last flattened: x [..., cols] is [rows, cols].
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace nf::ops {

// ---- Matrix products ---------------------------------------------------------------------------

// C = alpha * op(A) op(B) + beta * C, op(X) = X or X^T, fp32 accumulation.
// A: [M, K] ([K, M] if trans_a) or [batch, ...]; B: [K, N] ([N, K] if trans_b) or [batch, ...];
// C: [M, N] or [batch, M, N]. A 2-D operand next to a 3-D one is shared by every batch (stride
// 0). A and B share a floating dtype; C may be any floating dtype (fp32 C with beta = 1
// accumulates weight gradients into main grads).
struct GemmArgs {
  Tensor a, b, c;
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
  // Optional, 2-D products only: bias [n] in C's dtype, added to every row of C after the product
  // (the CUDA backend fuses it into cuBLASLt's epilogue; the CPU's is AddBias after the GEMM).
  Tensor bias = {};

  // The same product without the bias (what a backend runs before adding it itself).
  GemmArgs WithoutBias() const {
    return {.a = a,
            .b = b,
            .c = c,
            .trans_a = trans_a,
            .trans_b = trans_b,
            .alpha = alpha,
            .beta = beta};
  }
};
absl::Status Gemm(const GemmArgs& args);

// ---- Elementwise -------------------------------------------------------------------------------

// x[r, :] += bias for every row. x [rows, cols], bias [cols].
absl::Status AddBias(const Tensor& x, const Tensor& bias);
// dbias[c] += sum_r dy[r, c]. dy [rows, cols], dbias fp32 [cols].
absl::Status BiasBackward(const Tensor& dy, const Tensor& dbias);

enum class Activation {
  kGelu,         // x * Phi(x), exact erf form (fairseq's default "gelu")
  kGeluTanh,     // tanh approximation (GPT-2's "gelu_new" / "gelu_accurate")
  kReluSquared,  // max(x, 0)^2 (Primer)
};
// y = act(x). y may be x itself (in place).
absl::Status ActivationForward(Activation act, const Tensor& x, const Tensor& y);
// dx = dy * act'(x). dx may be dy itself.
absl::Status ActivationBackward(Activation act, const Tensor& x, const Tensor& dy,
                                const Tensor& dx);

// Inverted dropout with Philox masks keyed by global coordinates (core/philox.h). The tensor
// is [tokens, cols] with tokens = samples * seq_len in sample-major order; element (t, c) is
// token g = token_offset + t and uses sample = first_sample + g / seq_len, row = g % seq_len,
// col = col_offset + c (token_offset is where a sequence-parallel shard starts among the
// micro-batch's tokens, col_offset where a tensor-parallel shard starts among the features).
struct DropoutSpec {
  float p = 0.0f;  // probability of zeroing an element, 0 <= p < 1
  uint32_t seed = 0;
  uint32_t site = 0;  // identifies the dropout inside the network (layer, kind)
  uint64_t first_sample = 0;
  int64_t seq_len = 1;
  int64_t token_offset = 0;
  int64_t col_offset = 0;
  int64_t head_offset = 0;  // attention only: global index of this shard's first head
};
// y = x * keep / (1 - p). The backward pass is the same call on dy: the mask is recomputed.
// y may be x itself.
absl::Status Dropout(const Tensor& x, const Tensor& y, const DropoutSpec& spec);

// Per-channel scale: x viewed as [outer, channels, inner] with channels = scale.numel();
// y = x * scale[c]. NormFormer's head scales ([batch, heads, seq * head_dim] or
// [tokens, heads, head_dim]) and residual scale ([tokens, d_model, 1]) are both this op.
// y may be x itself.
absl::Status ScaleChannels(const Tensor& x, const Tensor& scale, int64_t inner, const Tensor& y);
// dx = dy * scale[c]; dscale (fp32) += sum over outer and inner of dy * x. dx may be dy.
absl::Status ScaleChannelsBackward(const Tensor& x, const Tensor& scale, int64_t inner,
                                   const Tensor& dy, const Tensor& dx, const Tensor& dscale);

// ---- Layout ----------------------------------------------------------------------------------

// Tokens [batch * seq, heads * head_dim] (sample-major) -> [batch, heads, seq, head_dim], the
// layout attention works in; MergeHeads is the inverse. Shapes come from the 4-D side. A 5-D
// side [groups, batch, heads, seq, head_dim] takes tokens [batch * seq, groups * heads *
// head_dim], each token's features group by group: the fused q, k, v projection's output into
// one tensor each for q, k and v.
absl::Status SplitHeads(const Tensor& tokens, const Tensor& heads);
absl::Status MergeHeads(const Tensor& heads, const Tensor& tokens);

// NormFormer's head scale (before the output projection) fused with MergeHeads: tokens =
// MergeHeads(heads * scale[h]) with heads [batch, heads, seq, head_dim] and scale [heads] (any
// float dtype), the bits of ScaleChannels(heads, scale, seq * head_dim) then MergeHeads, in one
// pass over the activations instead of two.
absl::Status MergeScaledHeads(const Tensor& heads, const Tensor& scale, const Tensor& tokens);
// Its backward from d_tokens (the token side's gradient): d_heads = SplitHeads(d_tokens) *
// scale[h]; dscale (fp32 [heads]) += sum over batch, seq and head_dim of SplitHeads(d_tokens) *
// heads. d_heads is distinct from heads.
absl::Status MergeScaledHeadsBackward(const Tensor& d_tokens, const Tensor& heads,
                                      const Tensor& scale, const Tensor& d_heads,
                                      const Tensor& dscale);

// ---- LayerNorm ---------------------------------------------------------------------------------

// y = (x - mean) * rstd * weight + bias over the last dimension.
// x, y [rows, cols]; weight, bias [cols] of one dtype; mean, rstd fp32 [rows] saved for the
// backward.
struct LayerNormArgs {
  Tensor x, weight, bias, y, mean, rstd;
  float eps = 1e-5f;
};
absl::Status LayerNormForward(const LayerNormArgs& args);

// Tensor-parallel LayerNorm over a feature dimension split across ranks (NormFormer's FFN
// LayerNorm): each rank computes per-row partial sums of its columns, the caller all-reduces
// them over the group, and the forward finishes from the global sums.
// stats f64 [rows, 2] = (sum x, sum x^2) over the local columns. Double precision keeps
// var = E[x^2] - mean^2 exact to fp32 level even for rows whose mean dwarfs their spread, for
// 16 bytes of all-reduce per token.
absl::Status LayerNormPartialStats(const Tensor& x, const Tensor& stats);
// As LayerNormForward, with mean and variance from all-reduced `stats` over `total_cols`.
absl::Status LayerNormForwardFromStats(const LayerNormArgs& args, const Tensor& stats,
                                       int64_t total_cols);

// dx from dy; dweight, dbias (fp32) accumulated.
struct LayerNormBackwardArgs {
  Tensor dy, x, weight, mean, rstd;
  Tensor dx, dweight, dbias;
};
absl::Status LayerNormBackward(const LayerNormBackwardArgs& args);
// Tensor-parallel backward: sums fp32 [rows, 2] = (sum g, sum g * xhat) over local columns,
// g = dy * weight; all-reduce them, then finish with the global sums over `total_cols`.
absl::Status LayerNormBackwardPartialSums(const LayerNormBackwardArgs& args, const Tensor& sums);
absl::Status LayerNormBackwardFromSums(const LayerNormBackwardArgs& args, const Tensor& sums,
                                       int64_t total_cols);

// ---- NormFormer's FFN LayerNorm, fused with the activation before it --------------------------

// y = LayerNorm(dropout(act(x))) over the last dimension: NormFormer's FFN middle, fc1's output
// x [rows, cols] to fc2's input y, each row in one pass. The activation's output is not kept:
// the backward recomputes it and its dropout mask from x, so a layer stores x and y as a Pre-LN
// layer stores x and act(x). weight, bias [cols] of one dtype; mean, rstd fp32 [rows]; scratch
// is like x, for backends that compose the unfused ops (activation, dropout, LayerNorm) in it.
// The results are those of that composition.
struct ActivationNormArgs {
  Activation act = Activation::kGelu;
  DropoutSpec dropout;
  Tensor x, weight, bias, y, mean, rstd, scratch;
  float eps = 1e-5f;
};
absl::Status ActivationNormForward(const ActivationNormArgs& args);

// The backward of ActivationNormForward from its x, mean and rstd: dx from dy (dx distinct from
// dy);
// dweight, dbias (fp32) accumulated; scratch as in the forward.
struct ActivationNormBackwardArgs {
  Activation act = Activation::kGelu;
  DropoutSpec dropout;
  Tensor dy, x, weight, mean, rstd, dx, dweight, dbias, scratch;
};
absl::Status ActivationNormBackward(const ActivationNormBackwardArgs& args);

// ---- The residual add fused with the LayerNorms on either side of it ---------------------------

// The end of the attention block and the start of the feed-forward block, each row in one pass:
//   z = dropout(LayerNorm_branch(branch))  (NormFormer's post-attention LayerNorm; Pre-LN:
//                                          z = dropout(branch))
//   residual = x + z,  y = LayerNorm(residual)  (the feed-forward block's input LayerNorm).
// x, branch, residual, y, scratch [rows, cols]; residual, y and scratch of branch's dtype, x of
// any float dtype. The branch LayerNorm is there when branch_weight is defined: branch_weight,
// branch_bias [cols] and branch_mean, branch_rstd fp32 [rows], as weight, bias, mean, rstd are
// for the residual's. scratch is for backends that compose the unfused ops (LayerNorm, dropout,
// cast, axpy, LayerNorm) in it. The results are that composition's.
struct ResidualNormArgs {
  DropoutSpec dropout;
  Tensor x, branch;
  Tensor residual, weight, bias, y, mean, rstd;
  Tensor branch_weight{}, branch_bias{}, branch_mean{}, branch_rstd{};  // optional
  Tensor scratch;
  float eps = 1e-5f;
  bool norms_branch() const { return branch_weight.defined(); }
};
absl::Status ResidualNormForward(const ResidualNormArgs& args);

// Its backward from dy (y's gradient): d_residual holds the residual's gradient from after the
// block and gains the LayerNorm's input gradient (it is then x's gradient too); d_branch =
// branch's gradient; dweight, dbias and, with the branch LayerNorm, d_branch_weight,
// d_branch_bias (fp32) accumulated. dy, d_residual, d_branch, branch and scratch distinct (a
// fused backend reads branch for the parameter gradients after writing d_branch).
struct ResidualNormBackwardArgs {
  DropoutSpec dropout;
  Tensor dy, residual, weight, mean, rstd;
  Tensor branch, d_residual, d_branch, dweight, dbias, scratch;
  Tensor branch_weight{}, branch_mean{}, branch_rstd{};  // optional, with:
  Tensor d_branch_weight{}, d_branch_bias{};
  bool norms_branch() const { return branch_weight.defined(); }
};
absl::Status ResidualNormBackward(const ResidualNormBackwardArgs& args);

// ---- Softmax and attention ---------------------------------------------------------------------

// y = softmax(x) over the last dimension. A row that is entirely -inf yields zeros.
absl::Status SoftmaxForward(const Tensor& x, const Tensor& y);
// dx = y * (dy - sum(dy * y)) per row.
absl::Status SoftmaxBackward(const Tensor& y, const Tensor& dy, const Tensor& dx);

// Scaled-dot-product attention with dropout on the probabilities. causal (the decoder's):
//   P = softmax(scale * Q K^T + causal mask), out = dropout(P) V, query i attending keys 0 .. i;
// causal false (an encoder's bidirectional attention): every query attends every key of its
// sequence, P = softmax(scale * Q K^T), out = dropout(P) V.
// q, k, v, out [batch, heads, seq, head_dim]; lse fp32 [batch, heads, seq] is the
// log-sum-exp of each row of scaled (masked) scores, saved so the backward recomputes P exactly.
// Dropout coordinates: sample = first_sample + b, head = head_offset + h, row = query
// position, col = key position (spec.seq_len and col_offset are unused). causal is the last
// member so that initialisers {q, k, v, out, lse, scale, dropout} keep the causal default.
struct AttentionArgs {
  Tensor q, k, v, out, lse;
  float scale = 1.0f;
  DropoutSpec dropout;
  bool causal = true;
};
absl::Status AttentionForward(const AttentionArgs& args);

// The backward of the AttentionForward call with the same q, k, v, out, lse, scale, dropout
// and causal.
struct AttentionBackwardArgs {
  Tensor q, k, v, out, lse, dout;
  Tensor dq, dk, dv;
  float scale = 1.0f;
  DropoutSpec dropout;
  bool causal = true;
};
absl::Status AttentionBackward(const AttentionBackwardArgs& args);

// Attention of new tokens over a key/value cache, for incremental decoding (no dropout, no lse:
// nothing runs backward). q, k, v [batch, heads, new, head_dim] are the new tokens', at
// positions past .. past + new - 1 of their sequences; k_cache, v_cache [batch, heads,
// capacity, head_dim] hold rows [0, past) from earlier calls. The op first writes k, v into rows
// [past, past + new) of the caches, then new token i attends keys 0 .. past + i (the causal mask
// offset by past): out [batch, heads, new, head_dim] = softmax(scale * q K^T + mask) V, the
// rows a causal AttentionForward gives for the same positions of the whole sequence.
struct KvCacheAttentionArgs {
  Tensor q, k, v, k_cache, v_cache, out;
  int64_t past = 0;
  float scale = 1.0f;
};
absl::Status KvCacheAttention(const KvCacheAttentionArgs& args);

// ---- Embedding and loss ------------------------------------------------------------------------

// out[t] = table[ids[t] - vocab_offset], or zeros when the id belongs to another rank's slice
// (vocab-parallel). ids i32 [tokens] must lie in [0, global_vocab), the real vocabulary (the
// table may carry padding rows beyond it); table [vocab_local, d]; out [tokens, d].
// global_vocab = 0 means vocab_offset + vocab_local.
struct EmbeddingArgs {
  Tensor ids, table, out;
  int64_t vocab_offset = 0;
  int64_t global_vocab = 0;
};
absl::Status EmbeddingForward(const EmbeddingArgs& args);
// dtable[ids[t] - vocab_offset] += dout[t] for the ids of this slice. dtable fp32.
absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                               int64_t vocab_offset);

// Cross-entropy over logits [rows, vocab_local] holding global columns
// [vocab_offset, vocab_offset + vocab_local). Columns with global id >= valid_vocab (vocab
// padding) are never predicted: they count as -inf. targets i32 [rows]; -1 ignores a row
// (loss 0, gradient 0); any other target outside [0, valid_vocab) is an error. With vocab
// slices, set valid_vocab to the real vocabulary size. Vocab-parallel use, over the
// tensor-parallel group:
//   CrossEntropyRowMax -> all-reduce max -> CrossEntropySumExp -> all-reduce sum of both
//   outputs -> CrossEntropyLoss; the backward needs the global row_max and sum_exp.
struct CrossEntropyArgs {
  Tensor logits, targets;
  int64_t vocab_offset = 0;
  int64_t valid_vocab = 0;  // 0 means every column is valid
};
// row_max fp32 [rows]: max over this slice's valid columns (-inf when it has none).
absl::Status CrossEntropyRowMax(const CrossEntropyArgs& args, const Tensor& row_max);
// sum_exp fp32 [rows] = sum of exp(logit - row_max) over this slice's valid columns;
// target_logit fp32 [rows] = the target's logit if this slice holds it, else 0.
absl::Status CrossEntropySumExp(const CrossEntropyArgs& args, const Tensor& row_max,
                                const Tensor& sum_exp, const Tensor& target_logit);
// loss fp32 [rows] = log(sum_exp) + row_max - target_logit (0 for ignored rows).
absl::Status CrossEntropyLoss(const Tensor& targets, const Tensor& row_max, const Tensor& sum_exp,
                              const Tensor& target_logit, const Tensor& loss);
// totals f64 [2] += (sum of loss over the rows whose target is not ignored, their number):
// a step's loss accumulates on the device and is read once, not after every micro-batch.
// loss fp32 [rows], targets i32 [rows]; the sum runs in row order (deterministic).
absl::Status AccumulateLoss(const Tensor& loss, const Tensor& targets, const Tensor& totals);
// One-rank forward: the three steps above without communication.
absl::Status CrossEntropyForward(const CrossEntropyArgs& args, const Tensor& row_max,
                                 const Tensor& sum_exp, const Tensor& loss);
// dlogits = dloss[r] * (softmax - onehot(target)) on this slice; zero on padding columns and
// ignored rows. dloss fp32 [rows]; dlogits like logits (may be logits itself).
absl::Status CrossEntropyBackward(const CrossEntropyArgs& args, const Tensor& row_max,
                                  const Tensor& sum_exp, const Tensor& dloss,
                                  const Tensor& dlogits);

// ---- Optimizer and mixed precision -------------------------------------------------------------

// One AdamW step on fp32 master weights (Loshchilov & Hutter, decoupled weight decay, as
// fairseq's Adam): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr * (wd * p + (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)).
// params, grads, exp_avg, exp_avg_sq: fp32, same shape. step t counts from 1.
struct AdamWArgs {
  Tensor params, grads, exp_avg, exp_avg_sq;
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.98f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;
};
absl::Status AdamWStep(const AdamWArgs& args);
// Whether AdamWStep(args), with the grads first multiplied by grad_scale (1, or the clipping
// coefficient ops::Scale would apply), would write a state that is not finite: found fp32 [1]
// is set to 1 when any new parameter, cast to model_dtype as ops::Cast does, is inf or NaN
// (fp16: |p| >= 65520; bf16: past its largest finite value once rounded; f32: inf or NaN), or
// any new moment is (left unchanged otherwise). Computes each element with the same
// arithmetic as AdamWStep (core/adamw_update.h) and writes nothing else: the check an update
// that cannot be undone needs beforehand.
absl::Status AdamWWouldOverflow(const AdamWArgs& args, float grad_scale, DType model_dtype,
                                const Tensor& found);

// grads *= inv_scale; found_nonfinite fp32 [1] is set to 1 if any result is inf or NaN
// (left unchanged otherwise, so one flag can collect several buffers).
absl::Status UnscaleAndCheck(const Tensor& grads, float inv_scale, const Tensor& found_nonfinite);
// out fp32 [1] += sum of x^2.
absl::Status SquaredNorm(const Tensor& x, const Tensor& out);

// ---- Data movement and BLAS-1 ------------------------------------------------------------------

// dst = src converted between floating dtypes (round to nearest even), or copied when both have
// the same dtype (any dtype, integers included). Same number of elements.
absl::Status Cast(const Tensor& src, const Tensor& dst);
// Every element of x set to value (floating or integer tensors).
absl::Status Fill(const Tensor& x, float value);
// x *= alpha.
absl::Status Scale(const Tensor& x, float alpha);
// y += alpha * x. Same number of elements.
absl::Status Axpy(float alpha, const Tensor& x, const Tensor& y);
// dst = src between devices (host <-> GPU) or within one: same dtype and number of elements.
// Asynchronous on GPUs like every op, except that a copy into host memory returns once the
// data has arrived.
absl::Status Copy(const Tensor& src, const Tensor& dst);
// A new zero-filled tensor on `device` (allocates: for set-up, not the per-micro-batch path).
absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape, Device device);
// The tensor itself when it is on the host, else a host copy (waits for the device).
absl::StatusOr<Tensor> OnHost(const Tensor& t);

}  // namespace nf::ops
