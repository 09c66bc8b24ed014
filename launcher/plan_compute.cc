#include "launcher/plan_compute.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "launcher/plan.h"
#include "launcher/trainer.h"
#include "model/vocab.h"

namespace nf::launcher {
namespace {

// Seconds to stream `bytes` through HBM; none where the cluster states no bandwidth (--cpu).
double MemorySeconds(double bytes, const ClusterSpec& cluster) {
  if (cluster.hbm_bytes_per_second <= 0) return 0.0;
  return bytes / (cluster.hbm_bytes_per_second * cluster.memory_efficiency);
}

}  // namespace

double GemmSeconds(double m, double n, double k, double batch, double element_bytes,
                   const ClusterSpec& cluster) {
  double waves = 1.0;  // the share of the last wave's SMs that have a tile
  if (cluster.sm_count > 0) {
    const double tiles = batch * std::ceil(m / 128) * std::ceil(n / 256);
    const double sms = cluster.sm_count;
    waves = tiles / (std::ceil(tiles / sms) * sms);
  }
  const double compute =
      2 * batch * m * n * k / (cluster.peak_flops * cluster.gemm_efficiency * waves);
  const double memory = MemorySeconds(batch * (m * k + k * n + m * n) * element_bytes, cluster);
  return std::max(compute, memory);
}

double OptimizerSeconds(double local_parameters, double element_bytes, const ClusterSpec& cluster) {
  // Read the fp32 gradient, read and write the fp32 master weight and both moments, write the
  // parameter, zero the gradient: 32 bytes and one parameter's.
  return MemorySeconds(local_parameters * (32 + element_bytes), cluster);
}

MicroBatchWork EstimateMicroBatchWork(const TrainConfig& config, const ClusterSpec& cluster) {
  const model::ModelConfig& m = config.model();
  const TrainOptions& train = config.train();
  const int tp = config.parallel().tensor_parallel();
  const bool sp = config.parallel().sequence_parallel() && tp > 1;
  const double s = static_cast<double>(SizeOf(ModelDType(train.precision())));
  const double mb = train.micro_batch_size(), seq = train.seq_len();
  const double t = mb * seq, d = m.d_model(), heads_local = m.num_heads() / tp;
  const double head_dim = d / m.num_heads(), d_local = d / tp, f_local = m.ffn_dim() / tp;
  const auto gemm = [&](double rows, double cols, double inner, double batch = 1) {
    return GemmSeconds(rows, cols, inner, batch, s, cluster);
  };
  MicroBatchWork work;

  // The layer's four products [T, n] = [T, k] x [k, n]: qkv, out_proj, fc1, fc2. The backward
  // runs each as two of the same FLOPs: the input gradient [T, k] and the weight gradient [n, k].
  const double products[4][2] = {{3 * d_local, d}, {d, d_local}, {f_local, d}, {d, f_local}};
  double gemm_forward = 0, input_grads = 0;
  for (const auto& [n, k] : products) {
    gemm_forward += gemm(t, n, k);
    input_grads += gemm(t, k, n);
    work.layer_weight_grads += gemm(n, k, t);
  }

  double attention_backward = 0;
  const bool attention_dropout = m.attention_dropout() > 0;
  if (cluster.materialized_attention) {
    // Per (sample, local head): scores [S, S] = q k^T (k = head_dim), out = P v; the backward's
    // dP = dO v^T, dV = P^T dO, dQ = dS k, dK = dS^T q. The S x S passes: scale-mask-softmax
    // reads and writes, dropout reads, writes and keeps a byte mask; backward one more each.
    const double batch = mb * heads_local, scores = batch * seq * seq * s;
    work.attention_forward = gemm(seq, seq, head_dim, batch) + gemm(seq, head_dim, seq, batch) +
                             MemorySeconds(scores * (attention_dropout ? 4.5 : 2), cluster);
    attention_backward = gemm(seq, seq, head_dim, batch) + 3 * gemm(seq, head_dim, seq, batch) +
                         MemorySeconds(scores * (attention_dropout ? 5.5 : 3), cluster);
  } else {
    // 4 b h S^2 head_dim FLOPs, half of them under the causal mask; the backward recomputes the
    // probabilities and runs four products: 2.5 x the forward.
    const double flops = 2 * mb * seq * seq * d_local;
    work.attention_forward = flops / (cluster.peak_flops * cluster.attention_efficiency);
    attention_backward = 2.5 * work.attention_forward;
  }

  // Memory-bound passes (elements read + written) of the forward, per token: over d (on this
  // rank's T / tp rows under sequence parallelism) the pre-attention and pre-FFN LayerNorms (2
  // each), two dropout + residual adds (3 each), NormFormer's post-attention LayerNorm (2) and
  // residual scale (1); over the local FFN width the activation (2), its dropout (2) and the
  // mid-FFN LayerNorm (2); over the local attention width the split of q, k, v into heads and
  // their merge (8).
  const model::NormFormerConfig& nf = m.normformer();
  const double d_passes = 10 + (nf.scale_attn() ? 2 : 0) + (nf.scale_resids() ? 1 : 0);
  const double f_passes = 2 + (m.activation_dropout() > 0 ? 2 : 0) + (nf.scale_fc() ? 2 : 0);
  const double rows = sp ? t / tp : t;
  const double streamed = s * (rows * d * d_passes + t * f_local * f_passes + t * d_local * 8);
  const double memory_forward = MemorySeconds(streamed, cluster);

  work.layer_forward = gemm_forward + work.attention_forward + memory_forward;
  work.layer_backward =
      input_grads + work.layer_weight_grads + attention_backward + 2 * memory_forward;

  // The head: logits [T, V / tp] = [T, d] x [d, V / tp], its two backward products, and the
  // loss's passes over fp32 logits (softmax statistics, the loss; the gradient written, read).
  const double vocab_local = static_cast<double>(model::PaddedVocabSize(m.vocab_size(), tp)) / tp;
  const double logits = 4 * t * vocab_local;
  work.head_forward = gemm(t, vocab_local, d) + MemorySeconds(2 * logits, cluster);
  work.head_backward =
      gemm(t, d, vocab_local) + gemm(vocab_local, d, t) + MemorySeconds(2 * logits, cluster);
  return work;
}

}  // namespace nf::launcher
