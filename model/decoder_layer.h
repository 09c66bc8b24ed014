// One NormFormer decoder layer with explicit Forward and Backward (docs/design.md section 4):
//
//   r = x;  h = LN_attn_in(x);  q,k,v = h W_{q,k,v}^T + b          column-parallel
//   o_i = softmax(q_i k_i^T / sqrt(d_head) + causal) v_i           attention dropout on P
//                                      (no causal mask in a masked LM's encoder layer)
//   o_i *= gamma_i                     (scale_heads, paper placement: before out_proj)
//   a = concat(o_i) W_o^T + b_o                                    row-parallel
//   a = a viewed as heads * gamma      (scale_heads, fairseq placement: after out_proj)
//   a = LN_post_attn(a)                (scale_attn)
//   x = r + dropout(a);  r = x
//   h = dropout_act(act(LN_ffn_in(x) W_1^T + b_1))                 column-parallel
//   h = LN_ffn_mid(h)                  (scale_fc)
//   x = lambda * r + dropout(h W_2^T + b_2)   (lambda: scale_resids, else 1)
//
// Tensors are token-major: [tokens = batch * seq, features]. Heads, ffn columns and the
// vocabulary are this rank's tensor-parallel shard ("local"); d_model is never split. With
// sequence parallelism the layer's input and output, and everything outside the
// column/row-parallel GEMMs (LayerNorms, dropouts, residual, scales), hold this rank's rows
// [T / tp, d] (model/tensor_parallel.h); T below is the micro-batch's tokens, Ts this rank's.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/ops/ops.h"
#include "model/normformer_params.h"
#include "model/tensor_parallel.h"
#include "parallel/communicator.h"

namespace nf::model {

// Shapes of one micro-batch on one tensor-parallel rank.
struct LayerShape {
  int64_t batch = 0, seq = 0;
  int64_t d_model = 0;
  int64_t heads = 0, head_dim = 0;  // local heads
  int64_t ffn = 0;                  // local ffn columns
  int64_t ffn_total = 0;            // ffn_dim of the whole model (what LN_ffn_mid spans)
  int64_t head_offset = 0;          // global index of the first local head
  int64_t ffn_offset = 0;           // global index of the first local ffn column
  DType dtype = DType::kF32;
  Device device = Device::Cpu();  // where activations and scratch live
  // Sequence parallelism: the tokens outside the tensor-parallel region are split into
  // sequence_shards (tp) blocks of rows, of which this rank holds block sequence_shard.
  int64_t sequence_shards = 1, sequence_shard = 0;

  int64_t tokens() const { return batch * seq; }
  bool sequence_parallel() const { return sequence_shards > 1; }
  int64_t shard_tokens() const { return tokens() / sequence_shards; }  // Ts
  int64_t first_token() const { return sequence_shard * shard_tokens(); }
  int64_t local_width() const { return heads * head_dim; }
};

// The layer's switches and rates, resolved from the model config.
struct LayerOptions {
  ops::Activation activation = ops::Activation::kGelu;
  float dropout = 0.0f, attention_dropout = 0.0f, activation_dropout = 0.0f;
  float eps = 1e-5f;
  // False: bidirectional self-attention (the masked LM's encoder), each token attends its whole
  // sequence.
  bool causal = true;
  bool scale_attn = false, scale_heads = false, heads_before_out_proj = true;
  bool scale_fc = false, scale_resids = false;
  // Selective activation recompute: the attention core's outputs (the attention output, its
  // log-sum-exp and the merged heads) are not kept; Backward computes them again from q, k and
  // v into the scratch. (The S x S scores and probabilities are never kept in any mode: the
  // attention kernels recompute them blockwise.)
  bool recompute_attention = false;
  // False: the layer only runs forwards (ModelOptions::gradients false); the scratch only its
  // backward uses is not allocated.
  bool backward = true;
};

// What Forward keeps for Backward. [T, ...] tensors are in the model dtype; statistics fp32.
struct LayerActivations {
  Tensor attn_in_norm, attn_in_mean, attn_in_rstd;  // [Ts, d], [Ts], [Ts]
  Tensor qkv;                                       // [3, B, H, S, Dh]: q, k, v
  Tensor q, k, v, attn, lse;  // [B, H, S, Dh] (q, k, v: views of qkv); lse [B, H, S]
  Tensor merged;              // [T, H * Dh]: out_proj's input
  // (attn, lse, merged: unset under recompute_attention, which uses the scratch's)
  Tensor attn_proj;                              // [Ts, d]: out_proj's output
  Tensor post_attn;                              // [Ts, d]: LN_post_attn's input
  Tensor post_attn_mean, post_attn_rstd;         // [Ts]
  Tensor residual;                               // [Ts, d]: x after the attention block
  Tensor ffn_in_norm, ffn_in_mean, ffn_in_rstd;  // [Ts, d], [Ts], [Ts]
  Tensor fc1_out;                                // [T, F]: before the activation
  Tensor act_out;  // [T, F]: after activation dropout; unset under an unsharded LN_ffn_mid
  Tensor mid_mean, mid_rstd;  // [T]
  Tensor fc2_in;              // [T, F]: LN_ffn_mid's output

  static absl::StatusOr<LayerActivations> Allocate(const LayerShape& shape,
                                                   const LayerOptions& options);
  // What Allocate takes, in bytes (for memory plans).
  static int64_t Bytes(const LayerShape& shape, const LayerOptions& options);
};

// Temporaries shared by all layers; nothing in them survives a Forward or Backward call.
// Without LayerOptions::backward, what only the backward uses (merged_grad, d_attn, d_qkv,
// model_width[2..3], ffn_width[1..2], row_sums) is undefined.
struct LayerScratch {
  Tensor merged_grad;     // [T, H * Dh]: out_proj's input gradient
  Tensor qkv_tokens;      // [T, 3 H Dh]: the q, k, v projection's output, then its gradient
  Tensor d_attn;          // [B, H, S, Dh]: attention's output gradient
  Tensor d_qkv;           // [3, B, H, S, Dh]: attention's input gradients
  Tensor dq, dk, dv;      // [B, H, S, Dh]: views of d_qkv
  Tensor model_width[4];  // [Ts, d]
  RegionBuffers region;   // [T, d] each under sequence parallelism, else undefined
  Tensor ffn_width[3];    // [T, F]
  Tensor row_stats;       // f64 [T, 2]: the sharded LN_ffn_mid's forward statistics
  Tensor row_sums;        // f32 [T, 2]: and its backward sums
  // The attention core's outputs under recompute_attention (else undefined): attn, lse and
  // merged as in LayerActivations, shared by the layers.
  Tensor attn, lse, merged;

  static absl::StatusOr<LayerScratch> Allocate(const LayerShape& shape,
                                               const LayerOptions& options);
  // What Allocate takes, in bytes (for memory plans).
  static int64_t Bytes(const LayerShape& shape, const LayerOptions& options);
};

// One layer's keys and values of the tokens decoded so far (incremental decoding): k, v
// [batch, local heads, capacity, head_dim] in the model dtype, rows [0, past) filled.
struct LayerKvCache {
  Tensor k, v;
  int64_t past = 0;
};

// Dropout randomness is keyed by (seed, site): site 0 is the embedding dropout, layer l's
// four dropouts are sites 1 + 4 l + kind.
enum class DropoutKind : uint32_t {
  kAttentionProbs = 0,
  kAttention = 1,
  kActivation = 2,
  kFfn = 3
};
uint32_t DropoutSite(int layer, DropoutKind kind);

class DecoderLayer {
 public:
  // `region` is over the tensor-parallel group (a group of one without tensor parallelism),
  // which must outlive the layer; its sequence parallelism matches shape's.
  DecoderLayer(int index, LayerParams params, LayerShape shape, LayerOptions options,
               TensorParallelRegion region)
      : index_(index),
        params_(std::move(params)),
        shape_(shape),
        options_(options),
        region_(region) {}

  // The layer's index in the whole model (errors name it).
  int index() const { return index_; }

  // Where a micro-batch sits in the global computation, and whether dropout is on.
  struct Step {
    uint64_t first_sample = 0;
    uint32_t seed = 0;
    bool train = true;
  };

  // x [Ts, d] -> y [Ts, d] (y must not alias x), filling `acts`. With `cache` (inference only:
  // no dropout, acts.lse unset, no Backward), x holds the next seq tokens of each sample after
  // the cache->past already cached: their keys and values join the cache (the caller advances
  // past) and they attend every cached token before them.
  absl::Status Forward(const Tensor& x, const Tensor& y, const Step& step, LayerActivations& acts,
                       LayerScratch& scratch, const LayerKvCache* cache = nullptr) const;
  // dy [Ts, d] -> dx [Ts, d] (no aliasing), from the x and acts of the matching Forward;
  // parameter gradients accumulate into the fp32 main grads.
  absl::Status Backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Step& step,
                        const LayerActivations& acts, LayerScratch& scratch) const;

 private:
  ops::DropoutSpec Dropout(DropoutKind kind, const Step& step) const;
  // Where the attention core's outputs live: the activations, or the scratch under
  // recompute_attention.
  struct AttentionCore {
    Tensor attn, lse, merged;
  };
  AttentionCore CoreOf(const LayerActivations& acts, const LayerScratch& scratch) const;
  // attention(q, k, v) -> core.attn (and core.lse without a cache), then the heads merged into
  // token order (times the head scales before out_proj) -> core.merged.
  absl::Status AttentionCoreForward(const LayerActivations& acts, const AttentionCore& core,
                                    const Step& step, const LayerKvCache* cache) const;

  int index_;
  LayerParams params_;
  LayerShape shape_;
  LayerOptions options_;
  TensorParallelRegion region_;
};

}  // namespace nf::model
